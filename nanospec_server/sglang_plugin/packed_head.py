"""The draft model's LM head over the packed rows of the active vocabularies.

SGLang's draft models call `self.logits_processor(input_ids, hidden, self.lm_head, batch)`.
We wrap that processor: it multiplies by our packed buffer instead of the full head, then
each logits row is masked to its own request's active set. Local row ids are turned back
into token ids by SGLang's own `hot_token_id[...]` lookups (the FR-Spec path), which the
draft worker points at the packed head's id map.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nanospec_server.sglang_plugin.runtime import NanoSpecRuntime


@dataclass
class PackedWeight:
    """Quacks like an LM-head module for SGLang's logits processor: a plain `.weight`."""

    weight: Tensor


class PackedHeadLogitsProcessor(nn.Module):
    def __init__(self, inner: nn.Module, runtime: NanoSpecRuntime, topk: int) -> None:
        super().__init__()
        self.inner = inner
        self.runtime = runtime
        self.topk = topk  # SGLang takes this many columns of our logits

    def forward(self, input_ids, hidden_states, lm_head, forward_batch, *args, **kwargs):
        vocab = self.runtime.vocab
        if vocab is not None:
            rows, _ = vocab.packed_rows(min_rows=self.topk)
            lm_head = PackedWeight(rows)
        output = self.inner(input_ids, hidden_states, lm_head, forward_batch, *args, **kwargs)
        logits = output.next_token_logits
        slots = getattr(forward_batch, "req_pool_indices", None)
        if logits is None or slots is None or len(slots) == 0 or logits.shape[0] % len(slots):
            return output
        slots = slots.to(torch.int64)
        if vocab is not None:
            row_slots = slots.repeat_interleave(logits.shape[0] // len(slots))
            vocab.mask_logits_(logits, row_slots)
        self.runtime.stats.record_head(slots, logits.shape[-1])
        return output
