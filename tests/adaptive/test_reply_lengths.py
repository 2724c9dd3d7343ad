"""What a running request may still decode, against a plain reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanospec_server.adaptive.reply_lengths import ReplyLengths


def reference_tokens_left(lengths: list[int], generated: int, limit: int, min_longer: int):
    longest = max(limit - generated, 0)
    longer = [length - generated for length in lengths if length > generated]
    if len(longer) < min_longer:
        return float(longest)
    return sum(min(extra, longest) for extra in longer) / len(longer)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.integers(1, 300), max_size=100),
    st.integers(0, 300),
    st.integers(0, 400),
)
def test_tokens_left_is_the_mean_overrun_of_longer_replies(lengths, generated, limit) -> None:
    estimate = ReplyLengths(remembered=64)
    for length in lengths:
        estimate.finished(length)
    expected = reference_tokens_left(lengths[-64:], generated, limit, estimate.min_longer)
    assert estimate.tokens_left(generated, limit) == pytest.approx(expected)


def test_short_replies_shorten_what_a_young_request_is_expected_to_decode() -> None:
    estimate = ReplyLengths()
    assert estimate.tokens_left(10, 128) == 118  # nothing seen: up to its limit
    for length in (13, 13, 15, 16, 21, 128, 128):
        estimate.finished(length)
    assert estimate.tokens_left(10, 128) == pytest.approx((3 + 3 + 5 + 6 + 11 + 118 + 118) / 7)
    assert estimate.tokens_left(100, 128) == 28  # it outlived all but two: its limit
