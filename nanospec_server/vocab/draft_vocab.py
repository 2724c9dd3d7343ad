"""An EAGLE-3 head's draft vocabulary D (its d2t list), and NanoSpec's windows over I ∩ D.

An EAGLE-3 head in SpecForge's format has an LM head of ``draft_vocab_size`` rows: draft
id i stands for token ``hot_token_id[i] = d2t[i] + i``. SGLang keeps only that map (it
drops ``t2d``); ``DraftIds`` builds the inverse, token -> draft id (-1 outside D), once at
load.

``DraftVocab`` is ``DynamicVocab`` in draft-id space: windows, bitmaps and the packed head
index the draft head's rows, so every kernel (C++ on CPU, Triton on CUDA) runs unchanged.
An append maps each token through the inverse. A token outside D still takes its stream
position, so a window remains the last W_max positions of S, but it is written as a
*placeholder*: a draft id that is pinned in the head anyway (the smallest of
(EOS ∪ P) ∩ D, else draft id 0, pinned for this alone). So the active rows are exactly
(I ∩ D) ∪ pinned, and no row is ever computed for a token outside D. ``row_token_ids``,
the table SGLang maps draft top-k rows through, is composed with ``hot_token_id`` after
every head update, on the stream that made it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from nanospec_server.vocab.dynamic_vocab import DynamicVocab


@dataclass(frozen=True)
class DraftIds:
    """D as two device tables: draft id -> token id, and its inverse."""

    token_of: Tensor  # [|D|] int64: hot_token_id
    draft_of: Tensor  # [V] int64: draft id of each token, -1 outside D

    @classmethod
    def from_hot_token_ids(cls, hot_token_id: Tensor, vocab_size: int) -> DraftIds:
        token_of = hot_token_id.to(torch.int64).flatten()
        if len(token_of) == 0 or token_of.min() < 0 or token_of.max() >= vocab_size:
            raise ValueError(f"draft vocabulary ids must lie in [0, {vocab_size})")
        if len(torch.unique(token_of)) != len(token_of):
            raise ValueError("draft vocabulary (d2t) maps two draft ids to one token")
        draft_of = torch.full((vocab_size,), -1, dtype=torch.int64, device=token_of.device)
        draft_of[token_of] = torch.arange(len(token_of), device=token_of.device)
        return cls(token_of, draft_of)

    @property
    def size(self) -> int:
        return len(self.token_of)

    def to(self, device: torch.device) -> DraftIds:
        return DraftIds(self.token_of.to(device), self.draft_of.to(device))

    def draft_id(self, tokens: Tensor) -> Tensor:
        """Draft id of each token id (-1 outside D, and for ids outside [0, V): padding in
        SGLang's batches, which must not index out of bounds on a device), same shape."""
        tokens = tokens.to(self.draft_of.device, torch.int64)
        vocab_size = len(self.draft_of)
        found = self.draft_of[tokens.clamp(0, vocab_size - 1)]
        return torch.where((tokens >= 0) & (tokens < vocab_size), found, -1)

    def contains(self, tokens: Tensor) -> Tensor:
        return self.draft_id(tokens) >= 0


class DraftVocab(DynamicVocab):
    """DynamicVocab over a pruned draft head: tokens in, draft rows inside, tokens out.

    ``lm_head_weight`` is the draft head ([|D|, d]); ``always_active`` are token ids (EOS,
    the prior P), of which those in D are pinned. Every other argument is DynamicVocab's.
    """

    def __init__(
        self,
        lm_head_weight: Tensor,
        draft_ids: DraftIds,
        num_slots: int,
        always_active: Sequence[int] = (),
        **kwargs,
    ):
        if lm_head_weight.shape[0] != draft_ids.size:
            raise ValueError(
                f"the draft head has {lm_head_weight.shape[0]} rows, its d2t {draft_ids.size}"
            )
        pinned_tokens = torch.tensor(sorted(set(always_active)), dtype=torch.int64)
        pinned = [d for d in draft_ids.draft_id(pinned_tokens).tolist() if d >= 0] or [0]
        super().__init__(lm_head_weight, num_slots, always_active=pinned, **kwargs)
        self.draft_ids = draft_ids.to(self.device)
        self.placeholder = self.always_active[0]  # pinned: it never takes a row of its own
        self.row_token_ids = torch.empty_like(self.row_ids)
        self._rows_changed()

    def _rows_changed(self) -> None:
        torch.index_select(self.draft_ids.token_of, 0, self.row_ids, out=self.row_token_ids)

    def _vocab_ids(self, tokens: Tensor) -> Tensor:
        draft = self.draft_ids.draft_id(tokens)
        return torch.where(draft >= 0, draft, self.placeholder)

    def contains(self, slots: Tensor, tokens: Tensor) -> Tensor:
        """Membership of token ids in I ∩ D (plus pinned draft ids) of each slot."""
        draft = self.draft_ids.draft_id(tokens)
        return super().contains(slots, draft.clamp(min=0)) & (draft >= 0)
