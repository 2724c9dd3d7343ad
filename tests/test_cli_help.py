"""Every `nanospec` command's `--help` equals its recording (tests/recorded/cli)."""

from __future__ import annotations

import pytest

from tests.surface import RECORDED, cli_help, help_file

HELP = cli_help()


def test_every_recorded_command_still_exists() -> None:
    recorded = {path.stem for path in (RECORDED / "cli").glob("*.txt")}
    assert recorded == {help_file(command).stem for command in HELP}


@pytest.mark.parametrize("command", sorted(HELP))
def test_help_is_unchanged(command: str) -> None:
    assert HELP[command] == help_file(command).read_text(), (
        f"`{command} --help` changed; if on purpose, re-record with `python -m tests.surface`"
    )
