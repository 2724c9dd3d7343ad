"""The host's pip configuration, made usable inside an image build without baking it in.

Usage: python deploy/image/pip_build_config.py STAGE_DIR

Reads the host's effective pip settings (`pip config list`: every config file, plus the
PIP_* environment), and writes STAGE_DIR/pip.conf with every local path in them (the CA
bundle, constraint files, find-links folders, file:// indexes) moved under /mnt/host. It
prints, one per line, the podman `--volume` options that mount STAGE_DIR at /mnt and each
of those host paths read-only at /mnt/host/<path>.

Why /mnt: a bind mount whose target is missing leaves an empty file or folder of that name
in the committed layer. /mnt already exists (empty) in Debian images, and the nested mount
points are created beforehand in STAGE_DIR on the host, so the image keeps no trace of the
host's paths. The build reads the file through PIP_CONFIG_FILE, a build argument of
Dockerfile.cpu, which sets it only while its RUN steps run.
"""

from __future__ import annotations

import ast
import os
import ssl
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

MOUNT_ROOT = Path("/mnt")
HOST_ROOT = MOUNT_ROOT / "host"
# Settings whose values name local files or folders; URL-valued ones may be file:// URLs.
PATH_KEYS = {"cert", "client-cert", "constraint", "find-links"}
INDEX_KEYS = {"index-url", "extra-index-url"}


def effective_settings() -> dict[str, dict[str, str]]:
    """{section: {key: value}} as pip applies them: files merged, then PIP_* on top."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    files: dict[str, dict[str, str]] = {}
    environment: dict[str, str] = {}
    for line in listing.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if section == ":env:":
            environment[key] = ast.literal_eval(value)
        else:
            files.setdefault(section, {})[key] = ast.literal_eval(value)
    files.setdefault("global", {}).update(environment)
    if "cert" not in files["global"] and (bundle := host_ca_bundle()):
        files["global"]["cert"] = bundle  # pip would use its own; the host's may add a proxy's CA
    return files


def host_ca_bundle() -> str | None:
    for candidate in (
        os.environ.get("PIP_CERT"),
        os.environ.get("REQUESTS_CA_BUNDLE"),
        os.environ.get("SSL_CERT_FILE"),
        ssl.get_default_verify_paths().cafile,
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


class Relocator:
    """Moves host paths under HOST_ROOT and remembers what to mount."""

    def __init__(self) -> None:
        self.mounts: set[Path] = set()

    def path(self, host_path: str) -> str:
        path = Path(host_path).resolve()
        if not path.exists():
            return host_path  # pip would ignore it on the host too
        self.mounts.add(path)
        return str(HOST_ROOT / path.relative_to("/"))

    def index(self, url: str) -> str:
        parsed = urlparse(url)
        if parsed.scheme != "file":
            return url
        index = Path(unquote(parsed.path)).resolve()
        if not index.exists():
            return url
        # A PEP 503 index's pages usually link to files beside it (../../files/x.whl), so its
        # parent folder travels with it.
        self.mounts.add(index.parent)
        return (HOST_ROOT / index.relative_to("/")).as_uri()

    def value(self, key: str, value: str) -> str:
        if key in INDEX_KEYS:
            return " ".join(self.index(url) for url in value.split())
        if key in PATH_KEYS:
            return " ".join(
                self.path(item) if item.startswith("/") else self.index(item)
                for item in value.split()
            )
        return value

    def outermost(self) -> list[Path]:
        """Each folder once: a path inside another mounted path needs no mount of its own."""
        return sorted(p for p in self.mounts if not any(o in p.parents for o in self.mounts))


def write_stage(stage: Path) -> list[str]:
    relocator = Relocator()
    lines: list[str] = []
    for section, settings in sorted(effective_settings().items()):
        lines.append(f"[{section}]")
        for key, value in sorted(settings.items()):
            relocated = relocator.value(key, value)
            lines.append(f"{key} = " + relocated.replace("\n", "\n    "))
    (stage / "pip.conf").write_text("\n".join(lines) + "\n")
    volumes = [f"--volume={stage}:{MOUNT_ROOT}:ro"]
    for host_path in relocator.outermost():
        mount_point = stage / HOST_ROOT.relative_to(MOUNT_ROOT) / host_path.relative_to("/")
        mount_point.parent.mkdir(parents=True, exist_ok=True)
        if host_path.is_dir():
            mount_point.mkdir(exist_ok=True)
        else:
            mount_point.touch()
        volumes.append(f"--volume={host_path}:{HOST_ROOT / host_path.relative_to('/')}:ro")
    return volumes


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    print("\n".join(write_stage(Path(sys.argv[1]).resolve())))


if __name__ == "__main__":
    main()
