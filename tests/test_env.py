"""`nanospec_server/env.py` is the only module that reads a NANOSPEC_* variable."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from nanospec_server import env

PACKAGE = Path(env.__file__).parent
NAME = re.compile(r"NANOSPEC_[A-Z0-9_]+")
ENV_NAMES = {
    name for name, value in vars(env).items() if isinstance(value, str) and NAME.fullmatch(value)
}


def _is_environ(node: ast.AST) -> bool:
    """`os.environ` or a bare `environ`."""
    if isinstance(node, ast.Attribute):
        return node.attr == "environ"
    return isinstance(node, ast.Name) and node.id == "environ"


def _names_variable(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return NAME.fullmatch(node.value) is not None
    if isinstance(node, ast.Attribute):
        return node.attr in ENV_NAMES
    return isinstance(node, ast.Name) and node.id in ENV_NAMES


def _read_key(node: ast.AST) -> ast.AST | None:
    """The key of an environment read (`os.environ.get(k)`, `os.getenv(k)`, `os.environ[k]`,
    `k in os.environ`, `os.environ.setdefault(k, ...)`), else None."""
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("get", "setdefault"):
            return node.args[0] if _is_environ(func.value) else None
        if isinstance(func, ast.Attribute) and func.attr == "getenv":
            return node.args[0]
        if isinstance(func, ast.Name) and func.id == "getenv":
            return node.args[0]
    if (
        isinstance(node, ast.Subscript)
        and isinstance(node.ctx, ast.Load)
        and _is_environ(node.value)
    ):
        return node.slice
    if isinstance(node, ast.Compare) and any(
        isinstance(op, (ast.In, ast.NotIn)) for op in node.ops
    ):
        if any(_is_environ(right) for right in node.comparators):
            return node.left
    return None


def direct_reads(source: str) -> list[str]:
    """Where `source` names a NANOSPEC_* variable itself or reads one from the environment."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and NAME.fullmatch(node.value)
        ):
            found.append(f"line {node.lineno}: names {node.value}")
        key = _read_key(node)
        if key is not None and _names_variable(key):
            found.append(f"line {node.lineno}: reads {ast.unparse(key)}")
    return found


def test_only_env_reads_nanospec_variables() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE.parent)} {where}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != Path(env.__file__)
        for where in direct_reads(path.read_text())
    ]
    assert not offenders, "read NANOSPEC_* variables through nanospec_server/env.py:\n" + "\n".join(
        offenders
    )


@pytest.mark.parametrize(
    "source",
    [
        'import os\nos.environ.get("NANOSPEC_CACHE")',
        'import os\nos.getenv("NANOSPEC_OPS", "")',
        "import os\nfrom nanospec_server import env\nos.environ[env.CACHE]",
        "import os\nfrom nanospec_server.env import URL\nURL in os.environ",
        'CACHE_ENV = "NANOSPEC_CACHE"',
    ],
)
def test_a_direct_read_is_found(source: str) -> None:
    assert direct_reads(source)


def test_writes_and_messages_pass() -> None:
    source = (
        "import os\nfrom nanospec_server import env\n"
        'os.environ[env.CONFIG] = "{}"\n'
        'message = "set NANOSPEC_FUSED_TOPK=0"\n'
    )
    assert direct_reads(source) == []


def test_every_variable_has_an_accessor_with_a_docstring() -> None:
    documented = {
        NAME.match(function.__doc__ or "").group(0)
        for function in vars(env).values()
        if callable(function)
        and getattr(function, "__module__", None) == env.__name__
        and NAME.match(function.__doc__ or "")
    }
    assert documented == {getattr(env, name) for name in ENV_NAMES}
