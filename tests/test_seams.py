"""`seams.py` is the whole list of our patches to SGLang: every listed symbol
exists in the pinned SGLang, no other module names a hook target or patches SGLang itself,
and every listed seam is installed by the module it names."""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import re
from collections import defaultdict
from pathlib import Path

import pytest

from nanospec_server import host, seams
from nanospec_server.seams import Seam, SeamKind

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nanospec_server"
SEAMS_FILE = PACKAGE / "seams.py"
PATCHED_PACKAGES = ("sglang", "uvicorn")
DOTTED = re.compile(rf"^(?:{'|'.join(PATCHED_PACKAGES)})(?:\.\w+)+$")
REGISTRY_NAMES = {"HookRegistry", "HookType"}


def missing_symbols(listed: tuple[Seam, ...]) -> list[str]:
    """Each seam whose symbol does not resolve, with why; a stand-in is missing where no
    SGLang module imports it."""
    missing = []
    for seam in listed:
        if seam.kind is SeamKind.STAND_IN:
            if not sglang_imports(seam.target):
                missing.append(f"{seam.name}: no SGLang module imports {seam.target}")
            continue
        try:
            pkgutil.resolve_name(seam.target)  # what HookRegistry resolves a target with
        except Exception as error:  # an upgrade may break it any way; report them all
            missing.append(f"{seam.name}: {seam.target} ({type(error).__name__}: {error})")
    return missing


def sglang_imports(module: str) -> bool:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    statement = re.compile(rf"^\s*(?:from|import)\s+{re.escape(module)}\b", re.MULTILINE)
    return any(
        statement.search(path.read_text(encoding="utf-8", errors="replace"))
        for location in spec.submodule_search_locations
        for path in Path(location).rglob("*.py")
    )


def is_module(dotted: str) -> bool:
    """Does ``dotted`` name a module or package (found on disk, nothing imported)?"""
    top, *rest = dotted.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        return False
    for location in spec.submodule_search_locations:
        path = Path(location).joinpath(*rest)
        if path.with_suffix(".py").is_file() or path.is_dir():
            return True
    return False


def stray_seams(source: str) -> list[str]:
    """What in ``source`` touches SGLang's HookRegistry, names a patch target (a dotted
    SGLang path that is no module, or an f-string built on one), or assigns into an
    imported SGLang module or class."""
    tree = ast.parse(source)
    found: list[str] = []
    dotted_names: set[str] = set()  # module-level names bound to a dotted SGLang path
    sglang_bound: set[str] = set()  # names an `import sglang...` binds
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            if isinstance(node.value.value, str) and DOTTED.match(node.value.value):
                dotted_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang"):
            sglang_bound.update(alias.asname or alias.name for alias in node.names)
            if node.module == "sglang.srt.plugins.hook_registry":
                found.append(f"line {node.lineno}: imports SGLang's hook registry")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("sglang"):
                    sglang_bound.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in REGISTRY_NAMES:
            found.append(f"line {node.lineno}: uses {node.id}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if DOTTED.match(node.value) and not is_module(node.value):
                found.append(f"line {node.lineno}: names {node.value!r}")
        elif isinstance(node, ast.JoinedStr):
            for part in node.values:
                built_on = (
                    isinstance(part, ast.FormattedValue)
                    and isinstance(part.value, ast.Name)
                    and part.value.id in dotted_names
                )
                if built_on or (
                    isinstance(part, ast.Constant) and str(part.value).startswith(PATCHED_PACKAGES)
                ):
                    found.append(f"line {node.lineno}: builds a dotted SGLang path")
                    break
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
            if node.args and getattr(node.args[0], "id", None) in sglang_bound:
                found.append(f"line {node.lineno}: setattr on SGLang's {node.args[0].id}")
        elif isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and (
                    getattr(target.value, "id", None) in sglang_bound
                ):
                    found.append(f"line {node.lineno}: assigns into SGLang's {target.value.id}")
    return sorted(found, key=lambda line: int(line.split()[1].rstrip(":")))


def installer_path(seam: Seam) -> Path:
    return ROOT / (seam.installer.replace(".", "/") + ".py")


def references(path: Path, name: str) -> bool:
    """Does the module at ``path`` name the seam constant ``name`` (``seams.NAME`` or an
    import of it)?"""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Attribute)
            and node.attr == name
            and getattr(node.value, "id", None) == "seams"
        ):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("seams"):
            if any(alias.name == name for alias in node.names):
                return True
    return False


@pytest.fixture(scope="module")
def cpu_environment() -> None:
    host.prepare_cpu_environment()  # before SGLang's platform detection


def test_every_listed_symbol_exists_in_the_pinned_sglang(cpu_environment) -> None:
    missing = missing_symbols(seams.SEAMS)
    assert not missing, "seams.py lists symbols SGLang lacks:\n" + "\n".join(missing)


def test_a_missing_symbol_is_reported_with_every_other(cpu_environment) -> None:
    gone = [
        Seam("GONE", f"{seams.SCHEDULER_IDLE.target}_gone", SeamKind.BEFORE, "-", "-"),
        Seam("ALSO_GONE", "sglang.srt.no_such_module.f", SeamKind.AROUND, "-", "-"),
        Seam("NO_IMPORT", "no_such_kernel", SeamKind.STAND_IN, "-", "-"),
    ]
    missing = missing_symbols((seams.SCHEDULER_IDLE, *gone))
    assert [line.split(":")[0] for line in missing] == ["GONE", "ALSO_GONE", "NO_IMPORT"]


def test_no_module_but_seams_names_a_hook_target_or_patches_sglang() -> None:
    strays = {
        str(path.relative_to(ROOT)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != SEAMS_FILE and (found := stray_seams(path.read_text(encoding="utf-8")))
    }
    assert not strays, f"list these in seams.py and install them from there: {strays}"


@pytest.mark.parametrize(
    "source",
    [
        "from sglang.srt.plugins.hook_registry import HookRegistry",
        'TARGET = "sglang.srt.managers.scheduler.Scheduler.on_idle"',
        'MODULE = "sglang.srt.managers.scheduler"\nTARGET = f"{MODULE}.Scheduler"',
        'TARGET = f"uvicorn.server.{NAME}"',
        "from sglang.srt.speculative import eagle_utils\nsetattr(eagle_utils, 'f', g)",
        "import sglang.srt.utils.common as common\ncommon.fast_topk = g",
    ],
)
def test_the_check_catches_a_hook_outside_seams(source: str) -> None:
    assert stray_seams(source)


def test_module_names_and_imports_are_no_seams() -> None:
    source = (
        'MODULE = "sglang.srt.managers.scheduler"\n'
        "from sglang.srt.managers import scheduler\n"
        "loaded = MODULE in modules\n"
        "args = scheduler.ServerArgs()\nargs.port = 1\n"
    )
    assert stray_seams(source) == []


def test_every_seam_is_installed_by_the_module_it_names() -> None:
    uninstalled = [
        f"{seam.name} (installer {seam.installer})"
        for seam in seams.SEAMS
        if not installer_path(seam).is_file() or not references(installer_path(seam), seam.name)
    ]
    assert not uninstalled, f"seams no installer references: {uninstalled}"


def test_each_seam_is_named_once_and_explained_in_one_line() -> None:
    assert all(getattr(seams, seam.name) is seam for seam in seams.SEAMS)
    # One symbol may carry hooks of several installers (each is its own seam), never two of one.
    targets = [(seam.target, seam.kind, seam.installer) for seam in seams.SEAMS]
    assert len(set(targets)) == len(targets)
    assert all(seam.reason and "\n" not in seam.reason for seam in seams.SEAMS)


def test_hook_registers_with_the_seams_hook_type(monkeypatch, cpu_environment) -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    monkeypatch.setattr(HookRegistry, "_hooks", defaultdict(list))  # keep the process's own

    def hook(*args, **kwargs) -> None:
        return None

    seams.hook(seams.SCHEDULER_IDLE, hook)
    assert HookRegistry._hooks[seams.SCHEDULER_IDLE.target] == [(HookType.BEFORE, hook, None)]


def test_attribute_and_hook_seams_are_not_interchangeable() -> None:
    with pytest.raises(ValueError, match="not a hook seam"):
        seams.hook(seams.TOP_K_RENORM, print)
    with pytest.raises(ValueError, match="not an attribute seam"):
        seams.patch(seams.EAGLE_SAMPLE, print)
