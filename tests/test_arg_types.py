"""The shared flag types accept their range and name the bad value otherwise."""

from __future__ import annotations

import argparse

import pytest

from nanospec_server.arg_types import fraction, non_negative_int, positive_float, positive_int


@pytest.mark.parametrize(
    ("parse", "good", "bad"),
    [
        (positive_int, ["1", "3072"], ["0", "-2"]),
        (non_negative_int, ["0", "7"], ["-1"]),
        (positive_float, ["0.5", "2"], ["0", "-0.1", "nan"]),
        (fraction, ["0", "0.25", "1"], ["-0.01", "1.5", "nan"]),
    ],
)
def test_range(parse, good: list[str], bad: list[str]) -> None:
    for text in good:
        assert parse(text) == type(parse(text))(text)
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError, match="got"):
            parse(text)


def test_a_bad_value_is_a_cli_error_naming_the_flag(capsys: pytest.CaptureFixture) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--w-max", type=positive_int)
    with pytest.raises(SystemExit):
        parser.parse_args(["--w-max", "0"])
    assert "--w-max" in capsys.readouterr().err
