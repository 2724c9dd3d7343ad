"""`/stats/vocab` figures from per-rank raw sums, against a plainly written reference."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from nanospec_server.admin.stats_models import RequestState, vocab_stats
from nanospec_server.sglang_plugin.stats.request_stats import Totals

CONFIG = {"mode": "nanospec", "w_max": 64, "w_cap": 128, "k_pre": 3, "k_ver": 3}
VOCAB = 1000


def entry(rid: str, state: str, steps: int, emitted: int, covered: int, finished_at=None):
    return {
        "rid": rid, "state": state, "mode": "nanospec", "prompt_tokens": 5,
        "output_tokens": emitted, "w_max": 64, "active_vocab_size": 40,
        "active_vocab_mean": 30.0, "active_vocab_max": 50, "coverage": None,
        "accept_length_mean": None, "draft_steps": steps, "accepted_draft_tokens": 0,
        "lm_head_calls": steps, "lm_head_rows_mean": 40.0, "started_at": 1.0,
        "finished_at": finished_at, "emitted_tokens": emitted, "covered_tokens": covered,
        "covered_by_head_tokens": emitted, "active_vocab_sum": 30 * steps, "lm_head_rows": 40 * steps,
        "plain_steps": 0, "catch_up_tokens": 0,
    }  # fmt: skip


def rank(dp_rank: int, finished: list[dict], running: list[dict]) -> dict:
    totals = Totals()
    for e in finished:
        totals.add(e)
    return {
        "dp_rank": dp_rank, "config": CONFIG, "vocab_size": VOCAB, "state_bytes": 100,
        "started_at": 10.0 + dp_rank, "history_size": 8, "totals": totals.__dict__,
        "running": running, "finished": finished,
    }  # fmt: skip


request_figures = st.tuples(st.integers(1, 50), st.integers(0, 200)).map(
    lambda t: (t[0], t[0] + t[1] % (3 * t[0] + 1))  # steps, emitted >= steps
)


@given(st.lists(st.lists(request_figures, max_size=6), min_size=1, max_size=3))
def test_aggregates_are_exact_over_ranks(per_rank) -> None:
    ranks = []
    for r, figures in enumerate(per_rank):
        finished = [
            entry(f"{r}-{i}", "finished", s, e, e // 2, finished_at=100.0 + i)
            for i, (s, e) in enumerate(figures)
        ]
        ranks.append(rank(r, finished, []))
    agg = vocab_stats(ranks).aggregates
    every = [f for figures in per_rank for f in figures]
    steps = sum(s for s, _ in every)
    emitted = sum(e for _, e in every)
    assert agg.requests_finished == len(every)
    assert agg.draft_steps == steps
    if steps:
        assert abs(agg.accept_length_mean - emitted / steps) < 1e-9
        assert abs(agg.active_vocab_mean - 30.0) < 1e-9
    if emitted:  # every emitted token was in the head's vocabulary
        assert agg.head_vocab_coverage_mean == 1.0
        assert agg.lm_head_rows_full_vocab == steps * VOCAB
        assert abs(agg.lm_head_rows_saved_fraction - (1 - 40 / VOCAB)) < 1e-9
    else:
        assert agg.accept_length_mean is None and agg.lm_head_rows_saved_fraction is None
    assert agg.state_bytes == 100 * len(per_rank)


def test_filter_limit_order_and_rank_labels() -> None:
    ranks = [
        rank(0, [entry("a", "finished", 2, 3, 1, 5.0), entry("b", "finished", 2, 3, 1, 9.0)], []),
        rank(1, [entry("c", "finished", 2, 3, 1, 7.0)], [entry("r", "running", 1, 1, 1)]),
    ]
    stats = vocab_stats(ranks)
    assert [e.rid for e in stats.requests] == ["r", "b", "c", "a"]  # running, then newest
    assert {e.rid: e.dp_rank for e in stats.requests} == {"r": 1, "b": 0, "c": 1, "a": 0}
    assert [r.dp_rank for r in stats.ranks] == [0, 1]
    assert stats.aggregates.requests_running == 1 and stats.aggregates.requests_finished == 3
    assert [e.rid for e in vocab_stats(ranks, RequestState.FINISHED, 2).requests] == ["b", "c"]
    assert [e.rid for e in vocab_stats(ranks, RequestState.RUNNING).requests] == ["r"]
    assert stats.started_at == 10.0
