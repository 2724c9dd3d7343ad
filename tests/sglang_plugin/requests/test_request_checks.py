"""The per-request checks that turn inputs SGLang would fail on into a 400 naming the field."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from nanospec_server.sglang_plugin.requests.checks import (
    check_float32_sampling_values,
    check_stats_every_chunk,
    check_stop_regex,
)


def request(**sampling) -> SimpleNamespace:
    return SimpleNamespace(sampling_params=sampling)


@pytest.mark.parametrize("pattern", ["(", "[a-", "a{2,1}", "(?P<x>a)(?P<x>b)", ["ok", "*"]])
def test_a_stop_regex_that_does_not_compile_is_a_value_error_naming_the_field(pattern) -> None:
    with pytest.raises(ValueError, match=r"^sampling_params\.stop_regex: .* is not a regular"):
        check_stop_regex(None, request(stop_regex=pattern))


@pytest.mark.parametrize("pattern", [None, "[a-z ]+", "(ab|cd)*$", ["x", r"\d+"], 5, [5]])
def test_valid_missing_or_mistyped_stop_regex_passes_to_sglang(pattern) -> None:
    # Mistyped values are SGLang's to refuse (its own 400); only patterns are ours.
    check_stop_regex(None, request(stop_regex=pattern))
    check_stop_regex(None, SimpleNamespace(sampling_params=None))


def test_the_message_carries_the_regex_error() -> None:
    with pytest.raises(ValueError) as raised:
        check_stop_regex(None, request(stop_regex="("))
    assert isinstance(raised.value.__cause__, re.error)
    assert "missing )" in str(raised.value)


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        ({"temperature": 1e39}, "temperature"),
        ({"logit_bias": {"5": 1e39}}, "logit_bias"),
        ({"logit_bias": {"5": -1e39}}, "logit_bias"),
        ({"logit_bias": {"5": float("nan")}}, "logit_bias"),
        ({"logit_bias": {"5": float("-inf")}}, "logit_bias"),
    ],
)
def test_a_value_float32_cannot_hold_is_a_value_error_naming_the_field(sampling, field) -> None:
    with pytest.raises(ValueError, match=rf"^sampling_params\.{field}: .* finite float32"):
        check_float32_sampling_values(None, request(**sampling))


@pytest.mark.parametrize(
    "sampling",
    [{}, {"temperature": 0.39}, {"logit_bias": {"94": 9e-299, "6": -0.5}}, {"logit_bias": "x"}],
)
def test_float32_values_and_mistyped_ones_pass_to_sglang(sampling) -> None:
    check_float32_sampling_values(None, request(**sampling))
    check_float32_sampling_values(None, SimpleNamespace(sampling_params=None))


@pytest.mark.parametrize("value", [1, 0, "true", None, [True]])
def test_stats_every_chunk_that_is_no_bool_is_a_value_error_naming_the_field(value) -> None:
    with pytest.raises(ValueError, match=r"^custom_params\.nanospec_stats_every_chunk: "):
        check_stats_every_chunk(None, request(custom_params={"nanospec_stats_every_chunk": value}))


@pytest.mark.parametrize("custom", [None, {}, {"w_max": 5}, {"nanospec_stats_every_chunk": False}])
def test_stats_every_chunk_absent_or_a_bool_passes(custom) -> None:
    check_stats_every_chunk(None, request(custom_params=custom))
    check_stats_every_chunk(None, request(custom_params={"nanospec_stats_every_chunk": True}))
