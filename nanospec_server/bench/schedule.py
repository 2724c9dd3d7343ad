"""The side-by-side schedule: which prompts go to which server, in which order.

On a noisy shared machine only ratios measured in one run hold, so every configuration's
server is up at once and each batch of prompts goes to every configuration in turn. The
order of configurations rotates from one batch to the next, so no configuration always
runs first (after an idle pause) or last. When memory limits how many servers can run at
once, configurations run in groups that each hold the anchors (``ar`` and the
full-vocabulary drafts), so every ratio is still taken within one group. With room for
``ar`` and one more server only (two servers: what a 2-core, 24 GB host holds for a 1.5B
target with a 0.5B draft), ``ar`` alone is the anchor and ratios to the full-vocabulary
draft are taken through it (``summary.py``). With room for one server only (a 1.5B
target and a 0.5B draft in float32), each configuration runs alone after ``ar``: ratios are
then taken across consecutive servers, which holds on an idle host only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Batch:
    group: int
    config: str
    turn: int  # 0: first user turn; 1: second turn after the model's first answer
    repeat: int
    concurrency: int
    prompt_ids: tuple[str, ...]  # sent concurrently

    @property
    def key(self) -> str:
        prompts = ",".join(self.prompt_ids)
        return (
            f"g{self.group}|{self.config}|t{self.turn}|r{self.repeat}|c{self.concurrency}|{prompts}"
        )


def groups(configs: list[str], anchors: list[str], max_servers: int | None) -> list[list[str]]:
    """Configurations in groups of at most ``max_servers``, every group holding the anchors,
    or only the first (``ar``) when the others leave no room; one server: one group each,
    ``ar``'s first."""
    if max_servers is None or max_servers >= len(configs):
        return [list(configs)]
    if max_servers == 1:
        return [[anchors[0]]] + [[c] for c in configs if c != anchors[0]]
    if max_servers - len(anchors) < 1:
        anchors = anchors[:1]
    others = [c for c in configs if c not in anchors]
    room = max_servers - len(anchors)
    if room < 1:
        raise ValueError(f"max_servers must be at least 1, not {max_servers}")
    return [anchors + others[i : i + room] for i in range(0, len(others), room)]


def anchor_group(config_groups: list[list[str]], group: int, anchor: str) -> int:
    """The group whose ``anchor`` (``ar``) a group's configurations are compared with: its
    own, or, where it runs alone, the first group that has one."""
    if anchor in config_groups[group]:
        return group
    return next(g for g, members in enumerate(config_groups) if anchor in members)


def rotated(items: list[str], shift: int) -> list[str]:
    shift %= len(items)
    return items[shift:] + items[:shift]


def williams_order(items: list[str], block: int) -> list[str]:
    """Row ``block`` of a Williams design over ``items``: over the rows each item runs in
    each place equally often, and right after each other item equally often (over twice as
    many rows as items where their number is odd). `rotated` keeps each item's neighbours
    from row to row; with more than two items, one that is never next to the anchor picks
    up more of the host's drift between batches. Two items alternate, as `rotated` does."""
    n = len(items)
    first, low, high = [0], 1, n - 1  # 0, 1, n-1, 2, n-2, ...
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    row = [(place + block) % n for place in first]
    if n % 2 and (block // n) % 2:
        row.reverse()
    return [items[i] for i in row]


def plan(
    config_groups: list[list[str]],
    prompt_turns: dict[str, int],
    repeats: int,
    concurrencies: list[int],
) -> list[Batch]:
    """Every batch of the run, in order. ``prompt_turns`` maps prompt id -> number of turns.

    Within a group: all first turns (every repeat and concurrency), then all second
    turns, since a second turn is built from ``ar``'s first answer. Batches of one
    concurrency take consecutive prompts; each batch goes to every configuration of the
    group, starting one further along the group each time.
    """
    batches = []
    for g, group in enumerate(config_groups):
        block = 0
        for turn in range(max(prompt_turns.values(), default=0)):
            prompts = [p for p, turns in prompt_turns.items() if turns > turn]
            for repeat in range(repeats):
                for c in concurrencies:
                    for start in range(0, len(prompts), c):
                        chunk = tuple(prompts[start : start + c])
                        for config in rotated(group, block):
                            batches.append(Batch(g, config, turn, repeat, c, chunk))
                        block += 1
    return batches
