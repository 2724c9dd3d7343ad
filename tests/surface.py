"""The user-facing surface of nanospec-server, recorded: every CLI command's `--help` and the
served OpenAPI schema. Tests compare the live surface with the recordings, so a refactoring
that changes a flag or a route fails; a deliberate change re-records them:

    python -m tests.surface          # rewrites tests/recorded/ (starts one tiny server)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

RECORDED = Path(__file__).parent / "recorded"
HELP_WIDTH = "100"  # argparse wraps help to $COLUMNS: fix it so recordings match anywhere


def command_parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("nanospec",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every (command path, parser) of the `nanospec` command tree, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from command_parsers(sub, (*path, name))


def cli_help() -> dict[str, str]:
    """`--help` of every command, keyed by its command line (e.g. "nanospec vocab trim")."""
    from nanospec_server.cli import build_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        return {" ".join(path): p.format_help() for path, p in command_parsers(build_parser())}
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


def help_file(command: str) -> Path:
    return RECORDED / "cli" / f"{command.replace(' ', '_')}.txt"


def tiny_server_flags() -> list[str]:
    """The admin tests' tiny speculative server, whose /openapi.json is recorded."""
    from nanospec_server.models.tiny import tiny_model_path
    from tests.admin.conftest import SPEC_FLAGS
    from tests.serving.conftest import BASE_FLAGS

    model = ["--model-path", str(tiny_model_path("tiny-target"))]
    return model + BASE_FLAGS + SPEC_FLAGS + ["--enable-metrics"]


def comparable_schema(schema: dict) -> dict:
    """`schema` without operation ids: FastAPI derives a route's id from one of its methods,
    and for SGLang's GET+POST routes which one depends on a set's (hash-seeded) order."""
    paths = {
        path: {
            method: {k: v for k, v in op.items() if k != "operationId"}
            for method, op in ops.items()
        }
        for path, ops in schema["paths"].items()
    }
    return {**schema, "paths": paths}


def record() -> None:
    from nanospec_server.launch.server import running_server

    (RECORDED / "cli").mkdir(parents=True, exist_ok=True)
    for old in (RECORDED / "cli").glob("*.txt"):
        old.unlink()
    for command, text in cli_help().items():
        help_file(command).write_text(text)
    import requests

    with tempfile.TemporaryDirectory() as tmp:
        with running_server(tiny_server_flags(), Path(tmp) / "server.log") as url:
            schema = requests.get(f"{url}/openapi.json", timeout=60).json()
    (RECORDED / "openapi.json").write_text(
        json.dumps(comparable_schema(schema), indent=1, sort_keys=True) + "\n"
    )


if __name__ == "__main__":
    record()
    sys.exit(0)
