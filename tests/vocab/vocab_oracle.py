"""The definition of the active vocabulary, written as plainly as possible (test oracle)."""

from collections.abc import Iterable


class NaiveVocab:
    def __init__(self, w_max: int, always_active: Iterable[int] = ()):
        self.w_max = w_max
        self.always_active = set(always_active)
        self.streams: dict[int, list[int]] = {}
        self.drafting: dict[int, set[int]] = {}  # the active set as of each slot's refresh
        self.own_w_max: dict[int, int] = {}  # a slot's own W_max, over the live one

    def reset(self, slot: int) -> None:
        self.streams[slot] = []
        self.drafting[slot] = set()
        self.own_w_max.pop(slot, None)

    def append(self, slot: int, tokens: Iterable[int]) -> None:
        self.streams.setdefault(slot, []).extend(tokens)

    def active(self, slot: int) -> set[int]:
        stream = self.streams.get(slot, [])
        w_max = self.own_w_max.get(slot) or self.w_max
        window = stream[max(0, len(stream) - w_max) :]
        return set(window) | self.always_active

    def refresh(self, slot: int) -> None:
        self.drafting[slot] = self.active(slot) - self.always_active

    def union(self) -> set[int]:
        return set().union(*self.drafting.values()) | self.always_active
