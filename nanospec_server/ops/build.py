"""Building the CUDA sources in ``ops/kernels/``: the JIT extension and a GPU-free compile check.

The ``.cu`` files are plain CUDA (no torch headers), so nvcc checks them in seconds; the
torch binding lives in ``ops/kernels/bindings.cpp`` and is only compiled by the JIT load.
"""

import functools
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import ModuleType

KERNEL_DIR = Path(__file__).resolve().parent / "kernels"
CUDA_SOURCES = ("scatter_rows.cu",)
# Hopper and Ampere: what the server is deployed on.
CHECK_ARCHS = ("sm_80", "sm_90")


def find_nvcc() -> str | None:
    for candidate in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
        if candidate and Path(candidate).exists():
            return candidate
    return None


def compile_check(nvcc: str | None = None, archs: tuple[str, ...] = CHECK_ARCHS) -> list[Path]:
    """Compile every CUDA source to a fatbin with nvcc (no GPU needed); raise on error."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found")
    gencode = [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]
    outputs = []
    with tempfile.TemporaryDirectory() as out_dir:
        for name in CUDA_SOURCES:
            out = Path(out_dir) / f"{name}.fatbin"
            command = [nvcc, "-fatbin", "-O3", "-std=c++17", *gencode, "-o", str(out)]
            subprocess.run([*command, str(KERNEL_DIR / name)], check=True, capture_output=True)
            outputs.append(KERNEL_DIR / name)
    return outputs


@functools.cache
def load_cuda_extension() -> ModuleType:
    """JIT-build the extension with torch's tooling (cached in TORCH_EXTENSIONS_DIR)."""
    # deferred: imports torch only when called
    from torch.utils.cpp_extension import load

    sources = [str(KERNEL_DIR / "bindings.cpp"), *(str(KERNEL_DIR / s) for s in CUDA_SOURCES)]
    return load(name="nanospec_kernels", sources=sources, extra_cuda_cflags=["-O3"])


if __name__ == "__main__":
    for source in compile_check():
        print(f"ok: {source}")
