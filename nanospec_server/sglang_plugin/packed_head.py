"""The draft model's LM head over the packed rows of the active vocabularies.

SGLang's draft models call `self.logits_processor(input_ids, hidden, self.lm_head, batch)`.
We wrap that processor: it multiplies by our packed buffer instead of the full head, then
each logits row is masked to its own request's active set. Local row ids are turned back
into token ids by SGLang's own `hot_token_id[...]` lookups (the FR-Spec path), which the
draft worker points at the packed head's id map.

The matmul itself goes through the seam SGLang offers quantized LM heads: its logits
processor calls `lm_head.quant_method.apply(lm_head, hidden, bias)` for any method it does
not know as unquantized. Ours runs `DynamicVocab.packed_logits`: on CUDA (fixed shapes, a
buffer of `union_capacity` rows, inside CUDA graphs) the Triton kernel reads only the rows
below the device-side live count, so the rows multiplied follow the live union.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nanospec_server.sglang_plugin.runtime import NanoSpecRuntime
from nanospec_server.vocab import DynamicVocab


@dataclass
class PackedLogitsMethod:
    """The `quant_method` of our packed head: logits over the live rows only."""

    vocab: DynamicVocab

    def apply(self, layer: PackedWeight, hidden: Tensor, bias: Tensor | None = None) -> Tensor:
        if bias is not None:  # no draft head SGLang loads has one
            raise NotImplementedError("nanospec: a draft LM head with a bias is not supported")
        return self.vocab.packed_logits(hidden, layer.weight)


@dataclass
class PackedWeight:
    """Quacks like an LM-head module for SGLang's logits processor."""

    weight: Tensor
    quant_method: PackedLogitsMethod


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
            lm_head = PackedWeight(rows, PackedLogitsMethod(vocab))
        output = self.inner(input_ids, hidden_states, lm_head, forward_batch, *args, **kwargs)
        logits = output.next_token_logits
        slots = getattr(forward_batch, "req_pool_indices", None)
        if logits is None or slots is None or len(slots) == 0 or logits.shape[0] % len(slots):
            return output
        slots = slots.to(torch.int64)
        rows_read = logits.shape[-1]
        if vocab is not None:
            vocab_slots = self.runtime.vocab_slots(slots)
            vocab.mask_logits_(logits, vocab_slots.repeat_interleave(logits.shape[0] // len(slots)))
            rows_read = vocab.rows_read
        self.runtime.stats.record_head(slots, rows_read)
        return output
