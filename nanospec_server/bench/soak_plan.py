"""What a soak sends: seeded requests of random lengths, each with the way it ends.

Most run to their end (whole or streamed); some are cut short, by a client that leaves
after a few chunks or through `/abort_request`; a few sample instead of decoding greedily,
and a few ask for their own W_max.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum

from nanospec_server.models.tiny.tokenizer import BOS_ID, VOCAB_SIZE


class Ending(str, Enum):
    WHOLE = "whole"  # one response
    STREAM = "stream"  # streamed to its end
    LEAVE = "leave"  # streamed; the client leaves after a few chunks
    ABORT = "abort"  # one response, cut short by /abort_request after a random delay

    @property
    def cut_short(self) -> bool:
        return self in (Ending.LEAVE, Ending.ABORT)


ENDING_WEIGHTS = {Ending.WHOLE: 45, Ending.STREAM: 30, Ending.LEAVE: 12, Ending.ABORT: 13}
SAMPLED_SHARE = 0.1
OWN_W_MAX_SHARE = 0.15
SAMPLING = {"temperature": 0.8, "top_p": 0.9}


@dataclass(frozen=True)
class Job:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    ending: Ending
    sampled: bool
    own_w_max: int | None
    leave_after: int  # chunks a leaving client reads
    abort_after_s: float  # delay before an aborting client's /abort_request

    @property
    def greedy(self) -> bool:
        return not self.sampled

    def params(self) -> dict:
        params = {"max_new_tokens": self.max_new_tokens, "temperature": 0.0}
        if self.sampled:
            params |= SAMPLING | {"sampling_seed": int(self.rid.rsplit("-", 1)[1])}
        if self.own_w_max is not None:
            params["custom_params"] = {"w_max": self.own_w_max}
        return params


def plan(
    requests: int, seed: int, max_prompt: int, max_new: int, w_cap: int, prefix: str = "soak"
) -> list[Job]:
    """`requests` jobs; ids are fixed-width, since /abort_request matches an id's prefix."""
    rng = random.Random(seed)
    endings, weights = list(ENDING_WEIGHTS), list(ENDING_WEIGHTS.values())
    width = len(str(requests))
    jobs = []
    for i in range(requests):
        # Mostly short prompts, some long: lengths spread over [1, max_prompt] log-evenly.
        length = min(max_prompt, int(max_prompt ** rng.random()))
        jobs.append(
            Job(
                rid=f"{prefix}-{seed}-{i:0{width}d}",
                input_ids=[BOS_ID] + [rng.randrange(3, VOCAB_SIZE) for _ in range(length)],
                max_new_tokens=rng.randint(1, max_new),
                ending=rng.choices(endings, weights)[0],
                sampled=rng.random() < SAMPLED_SHARE,
                own_w_max=rng.randint(1, w_cap) if rng.random() < OWN_W_MAX_SHARE else None,
                leave_after=rng.randint(1, 4),
                abort_after_s=rng.uniform(0.05, 2.0),
            )
        )
    return jobs
