"""The side-by-side schedule: rotation, the Williams order, groups with anchors, turn order."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanospec_server.bench.schedule import anchor_group, groups, plan, rotated, williams_order


def test_every_batch_goes_to_every_config_with_a_rotating_first() -> None:
    configs = ["ar", "full", "static", "nanospec"]
    batches = plan([configs], {f"p{i}": 1 for i in range(8)}, repeats=1, concurrencies=[1])
    assert len(batches) == 8 * 4
    blocks = [batches[i : i + 4] for i in range(0, len(batches), 4)]
    for b, block in enumerate(blocks):
        assert {x.prompt_ids for x in block} == {(f"p{b}",)}
        assert [x.config for x in block] == rotated(configs, b)
    # Each configuration goes first (and last) equally often.
    assert Counter(block[0].config for block in blocks) == Counter({c: 2 for c in configs})


def test_williams_order_alternates_two_items() -> None:
    firsts = [williams_order(["plain", "adaptive"], r)[0] for r in range(4)]
    assert firsts == ["plain", "adaptive", "plain", "adaptive"]


@pytest.mark.parametrize("count", [3, 4, 5])
def test_williams_order_balances_places_and_neighbours(count: int) -> None:
    items = ["plain", "adaptive", "fixed", "plain-2", "fifth"][:count]
    rows = count if count % 2 == 0 else 2 * count
    orders = [williams_order(items, r) for r in range(rows)]
    assert all(sorted(o) == sorted(items) for o in orders)
    places = Counter((item, o.index(item)) for o in orders for item in o)
    assert set(places.values()) == {rows // count}
    followers = Counter(pair for o in orders for pair in zip(o, o[1:], strict=False))
    assert len(followers) == count * (count - 1)  # every ordered pair of items
    assert set(followers.values()) == {rows // count}


def test_second_turns_come_after_all_first_turns_and_batches_group_prompts() -> None:
    turns = {"conv": 2, "qa": 1, "rag": 1}
    batches = plan([["ar", "x"]], turns, repeats=2, concurrencies=[1, 2])
    first_second = [i for i, b in enumerate(batches) if b.turn == 1][0]
    assert all(b.turn == 0 for b in batches[:first_second])
    assert {b.prompt_ids for b in batches if b.turn == 1} == {("conv",)}
    assert {b.prompt_ids for b in batches if b.concurrency == 2 and b.turn == 0} == {("conv", "qa"), ("rag",)}  # fmt: skip
    assert len({b.key for b in batches}) == len(batches)  # keys identify batches (resume)


@given(st.integers(1, 12), st.integers(3, 8))
def test_groups_hold_the_anchors_and_cover_every_config(n_others: int, max_servers: int) -> None:
    anchors = ["ar", "full"]
    configs = anchors + [f"c{i}" for i in range(n_others)]
    got = groups(configs, anchors, max_servers)
    assert all(g[:2] == anchors and len(g) <= max_servers for g in got)
    assert sorted(c for g in got for c in g[2:]) == sorted(configs[2:])
    assert groups(configs, anchors, None) == [configs]


def test_two_servers_pair_each_config_with_ar_alone() -> None:
    got = groups(["ar", "full", "x", "y"], ["ar", "full"], 2)
    assert got == [["ar", "full"], ["ar", "x"], ["ar", "y"]]


def test_one_server_runs_each_config_alone_after_ar() -> None:
    got = groups(["full", "ar", "x"], ["ar", "full"], 1)
    assert got == [["ar"], ["full"], ["x"]]
    assert [anchor_group(got, g, "ar") for g in range(3)] == [0, 0, 0]
    two = groups(["ar", "full", "x"], ["ar", "full"], 2)
    assert [anchor_group(two, g, "ar") for g in range(len(two))] == [0, 1]


def test_no_server_is_an_error() -> None:
    with pytest.raises(ValueError, match="max_servers must be at least 1"):
        groups(["ar", "full", "x"], ["ar", "full"], 0)
