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

In the draft loop (decode mode) on that path, the top-k that follows is fused too:
`PackedTopkMethod` returns the top-k carrier of `draft_topk.py` instead of logits, so
nothing scans the capacity. The draft-extend passes keep full-width logits (SGLang
re-slices them before its top-k, see docs/design.md).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nanospec_server.env import fused_topk
from nanospec_server.sglang_plugin.spec import tp_head
from nanospec_server.sglang_plugin.spec.draft_topk import DRAFT_TOPK
from nanospec_server.sglang_plugin.spec.runtime import NanoSpecRuntime
from nanospec_server.vocab import DynamicVocab

logger = logging.getLogger(__name__)


@dataclass
class PackedLogitsMethod:
    """The `quant_method` of our packed head: logits over the live rows only."""

    vocab: DynamicVocab

    def apply(self, layer: PackedWeight, hidden: Tensor, bias: Tensor | None = None) -> Tensor:
        if bias is not None:  # no draft head SGLang loads has one
            raise NotImplementedError("nanospec: a draft LM head with a bias is not supported")
        return self.vocab.packed_logits(hidden, layer.weight)


@dataclass
class PackedTopkMethod:
    """The `quant_method` of the fused path: the top-k carrier instead of logits."""

    vocab: DynamicVocab
    slots: Tensor  # vocabulary slot of each request of the batch
    k: int

    def apply(self, layer: PackedWeight, hidden: Tensor, bias: Tensor | None = None) -> Tensor:
        if bias is not None:
            raise NotImplementedError("nanospec: a draft LM head with a bias is not supported")
        row_slots = self.slots.repeat_interleave(hidden.shape[0] // len(self.slots))
        return DRAFT_TOPK.make_carrier(*self.vocab.packed_topk(hidden, row_slots, self.k))


@dataclass
class PackedWeight:
    """Quacks like an LM-head module for SGLang's logits processor."""

    weight: Tensor
    quant_method: PackedLogitsMethod | PackedTopkMethod


class PackedHeadLogitsProcessor(nn.Module):
    def __init__(
        self,
        inner: nn.Module,
        runtime: NanoSpecRuntime,
        topk: int,
        padding_columns: Tensor | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        # TP with a token map: the token of each gathered column, -1 where a rank had
        # fewer listed tokens than the others (``tp_head.shard_token_map``).
        self.padding_columns = padding_columns
        self.runtime = runtime
        self.topk = topk  # SGLang takes this many columns of our logits
        self.announced = False  # logged the first fused draft step

    def forward(self, *args, **kwargs):
        with self.runtime.stats.timer.lm_head():  # the masking is NanoSpec's head cost too
            return self._forward(*args, **kwargs)

    def _forward(self, input_ids, hidden_states, lm_head, forward_batch, *args, **kwargs):
        vocab = self.runtime.vocab
        slots = getattr(forward_batch, "req_pool_indices", None)
        fused = self._fuses_topk(forward_batch)
        if vocab is not None:
            rows, _ = vocab.packed_rows(min_rows=self.topk)
            method = PackedLogitsMethod(vocab)
            if fused:
                vocab_slots = self.runtime.vocab_slots(slots.to(torch.int64))
                method = PackedTopkMethod(vocab, vocab_slots, self.topk)
            lm_head = PackedWeight(rows, method)
        output = self.inner(input_ids, hidden_states, lm_head, forward_batch, *args, **kwargs)
        logits = output.next_token_logits
        if self.padding_columns is not None and logits is not None:
            tp_head.mask_padding_columns_(logits, self.padding_columns)
        if fused and logits is not None and not DRAFT_TOPK.is_carrier(logits):
            raise RuntimeError(
                "nanospec: SGLang's logits processor altered the fused draft top-k; "
                "set NANOSPEC_FUSED_TOPK=0"
            )
        if logits is None or slots is None or len(slots) == 0 or logits.shape[0] % len(slots):
            return output
        slots = slots.to(torch.int64)
        rows_read = logits.shape[-1]
        if fused:
            rows_read = vocab.rows_read
        elif vocab is not None:
            vocab_slots = self.runtime.vocab_slots(slots)
            vocab.mask_logits_(logits, vocab_slots.repeat_interleave(logits.shape[0] // len(slots)))
            rows_read = vocab.rows_read
        self.runtime.stats.record_head(slots, rows_read)
        return output

    def _fuses_topk(self, forward_batch) -> bool:
        """The draft loop's steps (decode mode) on the fixed-shape Triton path, unless the
        processor would edit logits (scale, soft-capping) or the operator turned it off.
        Off the GPU, SGLang's chain (topk = 1) takes an inline `torch.argmax` that no hook
        reaches, so there only trees are fused (CPU runs this path only in tests)."""
        vocab, mode = self.runtime.vocab, getattr(forward_batch, "forward_mode", None)
        slots = getattr(forward_batch, "req_pool_indices", None)
        fused = (
            vocab is not None
            and vocab.fuses_topk
            and FUSED_TOPK_ENABLED
            and (self.topk > 1 or vocab.device.type == "cuda")
            and mode is not None
            and mode.is_decode()
            and slots is not None
            and len(slots) > 0
            and getattr(self.inner, "logit_scale", None) is None
            and not getattr(self.inner, "final_logit_softcapping", None)
        )
        if fused and not self.announced:
            self.announced = True
            logger.info("nanospec: draft top-k fused into the packed head (k=%d)", self.topk)
        return fused


# NANOSPEC_FUSED_TOPK=0 keeps SGLang's own softmax + top-k over full-width logits. So does
# SGLang's async index assertion, which checks draft ids against the logits' width (2k).
FUSED_TOPK_ENABLED = fused_topk() and os.environ.get(
    "SGLANG_ENABLE_ASYNC_ASSERT", ""
).lower() not in ("1", "true")
