"""docs/modules.md gives every module of the package one line (mini-sglang's habit)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nanospec_server"
IMPORT_ROOT = PACKAGE / "sgl_kernel_cpu" / "import_root"  # the stand-in's import path


def test_every_module_has_its_line() -> None:
    page = (ROOT / "docs" / "modules.md").read_text(encoding="utf-8")
    modules = [p for p in PACKAGE.rglob("*.py") if IMPORT_ROOT not in p.parents]
    assert len(modules) > 50
    missing = [
        str(p.relative_to(PACKAGE))
        for p in modules
        if f"- `{p.relative_to(PACKAGE).as_posix()}`: " not in page
    ]
    assert not missing, f"docs/modules.md lacks a line for: {missing}"


def test_no_line_names_a_module_that_is_gone() -> None:
    page = (ROOT / "docs" / "modules.md").read_text(encoding="utf-8")
    named = [line.split("`")[1] for line in page.splitlines() if line.startswith("- `")]
    gone = [name for name in named if name.endswith(".py") and not (PACKAGE / name).is_file()]
    assert not gone, f"docs/modules.md names modules that do not exist: {gone}"
