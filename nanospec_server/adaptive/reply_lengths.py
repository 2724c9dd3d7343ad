"""How many tokens a running request may still decode, from the lengths of the replies that
finished last on this server (no SGLang import).

A request's ``max_new_tokens`` bounds what it decodes, but a chat reply mostly stops at its
stop token well before: priced up to its limit, the draft's catch-up for two 13-token
replies was judged repaid over a hundred tokens each, and the replies ended two steps after
it. What a request decodes from here is estimated as the mean, over the recent replies
longer than it is now, of how much longer they ran (each capped by the request's own
limit): a survival estimate that needs no model of the prompt.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass
class ReplyLengths:
    """The output lengths of the last ``remembered`` finished requests."""

    remembered: int = 64
    min_longer: int = 4  # replies that ran past a request's length, to trust their mean
    _lengths: deque = field(default_factory=deque)

    def __post_init__(self) -> None:
        self._lengths = deque(self._lengths, maxlen=self.remembered)

    def finished(self, length: int) -> None:
        self._lengths.append(length)

    def tokens_left(self, generated: int, limit: int) -> float:
        """What a request that has decoded ``generated`` tokens of at most ``limit`` may still
        decode: ``limit - generated`` until ``min_longer`` recent replies ran longer than
        ``generated`` (a request that outlived the replies seen has no estimate better than
        its limit)."""
        longest = max(limit - generated, 0)
        lengths = np.fromiter(self._lengths, dtype=np.int64, count=len(self._lengths))
        longer = lengths[lengths > generated]
        if len(longer) < self.min_longer:
            return float(longest)
        return float(np.mean(np.minimum(longer - generated, longest)))
