"""Imports run one way: no module imports itself through others, and no package imports a
package of a higher layer. The layers are the list under "Layers" in docs/modules.md; every
import counts, at module level and inside functions alike, except those under
``if TYPE_CHECKING:``, which only name types for annotations and load nothing."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "nanospec_server"
MODULES_MD = ROOT / "docs" / "modules.md"

Graph = dict[str, set[str]]


def module_names(root: Path) -> dict[str, Path]:
    """Every module under ``root/nanospec_server``, by dotted name (a package by its own)."""
    names = {}
    for path in (root / PACKAGE).rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _imported(node: ast.Import | ast.ImportFrom, name: str, is_package: bool) -> list[str]:
    """The dotted names an import statement loads (``from x import y`` loads ``x.y`` when y is
    a module, else ``x``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = name.split(".") if is_package else name.split(".")[:-1]
    if node.level:
        base = base[: len(base) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    return [module] + [f"{module}.{alias.name}" for alias in node.names]


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in {
        "TYPE_CHECKING",
        "typing.TYPE_CHECKING",
    }


def runtime_nodes(tree: ast.AST) -> Iterable[ast.AST]:
    """Every node of ``tree`` outside ``if TYPE_CHECKING:`` blocks (their ``else`` runs)."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            pending.extend(child.orelse if _type_checking_only(child) else [child])


def import_graph(root: Path) -> Graph:
    """Module -> the package modules it imports, at any depth of its code."""
    modules = module_names(root)
    graph: Graph = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in runtime_nodes(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            loaded = [target for target in _imported(node, name, is_package) if target]
            submodules = [target for target in loaded[1:] if target in modules]
            if isinstance(node, ast.ImportFrom) and len(submodules) == len(node.names):
                loaded = submodules  # `from pkg import mod, mod2`: the modules, not pkg
            for target in loaded:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target.startswith(PACKAGE) and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """One import cycle (a path back to its start) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(_cycle_through(node, component, graph))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _cycle_through(start: str, component: set[str], graph: Graph) -> list[str]:
    """A shortest path from ``start`` back to itself inside ``component``."""
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph.get(node, ())):
                if nxt == start:
                    return paths[node] + [start]
                if nxt in component and nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{start} is in no cycle")


def package_of(module: str) -> str:
    """The top-level piece a module belongs to: ``bench`` for ``nanospec_server.bench.cli``,
    ``env`` for ``nanospec_server.env``; the root package itself is ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def documented_layers(text: str) -> list[set[str]]:
    """The numbered lines under "## Layers", bottom first: each a set of package names."""
    section = text.split("\n## Layers\n", 1)[1]
    return [
        {name.removesuffix(".py").rstrip("/") for name in re.findall(r"`([^`]+)`", line)}
        for line in section.splitlines()
        if re.match(r"\d+\. ", line)
    ]


def layer_violations(graph: Graph, layers: list[set[str]]) -> list[str]:
    """Every import of a package that is not in a lower layer than the importer's."""
    layer = {package: depth for depth, packages in enumerate(layers) for package in packages}
    found = []
    for module, targets in sorted(graph.items()):
        own = package_of(module)
        for target in sorted(targets):
            other = package_of(target)
            if other != own and not layer[other] < layer[own]:
                found.append(
                    f"{module} imports {target}: layer {layer[own] + 1} ({own}) may not "
                    f"import layer {layer[other] + 1} ({other})"
                )
    return found


def _packages(graph: Graph) -> set[str]:
    return {package_of(module) for module in graph}


def _unplaced(packages: Iterable[str], layers: list[set[str]]) -> list[str]:
    placed = [package for packages_ in layers for package in packages_]
    return sorted(
        {p for p in packages if placed.count(p) != 1} | {p for p in placed if placed.count(p) > 1}
    )


def test_no_import_cycles() -> None:
    found = cycles(import_graph(ROOT))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_every_package_is_in_one_layer() -> None:
    layers = documented_layers(MODULES_MD.read_text())
    assert not _unplaced(_packages(import_graph(ROOT)), layers), "docs/modules.md, Layers"


def test_no_package_imports_a_higher_layer() -> None:
    graph = import_graph(ROOT)
    found = layer_violations(graph, documented_layers(MODULES_MD.read_text()))
    assert not found, "imports against the layers of docs/modules.md:\n" + "\n".join(found)


def _plant(root: Path, files: dict[str, str]) -> Graph:
    for relative, source in files.items():
        path = root / PACKAGE / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return import_graph(root)


def test_a_planted_upward_import_inside_a_function_is_reported(tmp_path: Path) -> None:
    graph = _plant(tmp_path, {
        "__init__.py": "",
        "env.py": "def f():\n    from nanospec_server.bench import cli\n",
        "bench/__init__.py": "",
        "bench/cli.py": "from nanospec_server import env\n",
    })  # fmt: skip
    layers = [{"__init__", "env"}, {"bench"}]
    assert layer_violations(graph, layers) == [
        "nanospec_server.env imports nanospec_server.bench.cli: layer 1 (env) may not "
        "import layer 2 (bench)"
    ]
    assert cycles(graph) == [
        ["nanospec_server.bench.cli", "nanospec_server.env", "nanospec_server.bench.cli"]
    ]


def test_a_planted_cycle_through_relative_imports_is_reported(tmp_path: Path) -> None:
    graph = _plant(tmp_path, {
        "__init__.py": "",
        "ops/__init__.py": "from .a import f\n",
        "ops/a.py": "from . import b\n",
        "ops/b.py": "def g():\n    from nanospec_server.ops import f\n",
    })  # fmt: skip
    assert cycles(graph) == [
        ["nanospec_server.ops", "nanospec_server.ops.a", "nanospec_server.ops.b",
         "nanospec_server.ops"]
    ]  # fmt: skip
    assert layer_violations(graph, [{"__init__", "ops"}]) == []


def test_type_checking_imports_are_not_counted_but_real_ones_beside_them_are(
    tmp_path: Path,
) -> None:
    graph = _plant(tmp_path, {
        "__init__.py": "",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from nanospec_server import b\n",
        "b.py": "from nanospec_server import a\nif TYPE_CHECKING:\n    pass\nelse:\n    from nanospec_server import c\n",
        "c.py": "",
    })  # fmt: skip
    assert graph["nanospec_server.a"] == set()
    assert graph["nanospec_server.b"] == {"nanospec_server.a", "nanospec_server.c"}
    assert cycles(graph) == []


def test_a_package_missing_from_the_layers_is_reported() -> None:
    assert _unplaced({"env", "bench"}, [{"env"}]) == ["bench"]
    assert _unplaced({"env"}, [{"env"}, {"env"}]) == ["env"]
