"""The definition of the active vocabulary, written as plainly as possible (test oracle)."""

from collections.abc import Iterable


class NaiveVocab:
    def __init__(self, w_max: int, always_active: Iterable[int] = ()):
        self.w_max = w_max
        self.always_active = set(always_active)
        self.streams: dict[int, list[int]] = {}
        self.drafting: dict[int, set[int]] = {}  # the active set as of each slot's refresh

    def reset(self, slot: int) -> None:
        self.streams[slot] = []
        self.drafting[slot] = set()

    def append(self, slot: int, tokens: Iterable[int]) -> None:
        self.streams.setdefault(slot, []).extend(tokens)

    def active(self, slot: int) -> set[int]:
        stream = self.streams.get(slot, [])
        window = stream[max(0, len(stream) - self.w_max) :]
        return set(window) | self.always_active

    def refresh(self, slot: int) -> None:
        self.drafting[slot] = self.active(slot) - self.always_active

    def union(self) -> set[int]:
        return set().union(*self.drafting.values()) | self.always_active
