"""The order `benchmarks/load_table.py` runs a round's servers in: balanced over the rounds."""

from __future__ import annotations

import importlib
from collections import Counter
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
NAMES = ["plain", "adaptive", "fixed", "plain-2", "fifth"]


@pytest.fixture
def order(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import their neighbours
    return importlib.import_module("load_table").server_order


def test_two_servers_alternate(order) -> None:
    firsts = [order(["plain", "adaptive"], r)[0] for r in range(4)]
    assert firsts == ["plain", "adaptive", "plain", "adaptive"]


@pytest.mark.parametrize("count", [3, 4, 5])
def test_places_and_neighbours_balance_over_the_rounds(order, count: int) -> None:
    names = NAMES[:count]
    rounds = count if count % 2 == 0 else 2 * count
    orders = [order(names, r) for r in range(rounds)]
    assert all(sorted(o) == sorted(names) for o in orders)
    places = Counter((name, o.index(name)) for o in orders for name in o)
    assert set(places.values()) == {rounds // count}
    followers = Counter(pair for o in orders for pair in zip(o, o[1:], strict=False))
    assert len(followers) == count * (count - 1)  # every ordered pair of servers
    assert set(followers.values()) == {rounds // count}
