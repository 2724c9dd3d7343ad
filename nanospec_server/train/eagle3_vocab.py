"""An EAGLE-3 head's draft vocabulary D from the token frequency of the training answers,
written as SpecForge writes it.

SpecForge counts the tokens of the trained (loss-masked) positions, takes the
``draft_vocab_size`` most frequent, pads with the lowest unused ids when fewer distinct
tokens occur, sorts D ascending and stores two buffers:

* ``d2t`` [|D|] int64: ``D[i] - i`` (SGLang loads ``hot_token_id = d2t + arange``);
* ``t2d`` [V] bool: membership of each token in D (SGLang drops it).

Ties in frequency go to the lower token id, so D is deterministic.
"""

from __future__ import annotations

import torch

from nanospec_server.train.distill import DistilledRows


def answer_token_counts(rows: DistilledRows, vocab_size: int) -> torch.Tensor:
    """How often each token occurs in the rows' answers (the tokens the draft must guess)."""
    column = torch.arange(rows.input_ids.shape[1])[None]
    answer = (column >= rows.prompt_lengths[:, None].long()) & (
        column < rows.lengths[:, None].long()
    )
    return torch.bincount(rows.input_ids[answer].long(), minlength=vocab_size)[:vocab_size]


def draft_vocabulary(counts: torch.Tensor, size: int) -> torch.Tensor:
    """D: the ``size`` most frequent tokens (ties and unseen tokens: lower id first), sorted."""
    vocab_size = len(counts)
    if not 0 < size <= vocab_size:
        raise ValueError(f"--draft-vocab-size {size}: must lie in [1, {vocab_size}]")
    # a stable sort on -count keeps ids ascending among equal counts
    order = torch.sort(-counts.long(), stable=True).indices
    return order[:size].sort().values


def d2t_t2d(draft_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SpecForge's buffers for the ascending draft vocabulary ``draft_ids``."""
    draft_ids = draft_ids.long()
    d2t = draft_ids - torch.arange(len(draft_ids))
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    return d2t, t2d
