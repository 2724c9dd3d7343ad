"""STANDALONE drafts: a small model of its own beside the target, fed tokens, not hidden states.

Its head is the draft model's own (SGLang's `init_lm_head` leaves it whole even with a token
map), and top-K_pre needs the target's hidden states at prefill, which SGLang's STANDALONE
worker does not capture.
"""

from __future__ import annotations

import copy

import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from torch import Tensor

from nanospec_server.sglang_plugin.spec.draft_kinds.base import DraftKind


class StandaloneKind(DraftKind):
    name = "STANDALONE"
    algorithms = ("STANDALONE",)
    tiny_draft = "tiny-standalone"

    def prepare_head(self, worker) -> None:
        if worker.hot_token_id is not None:
            _prune_head(worker.draft_runner.model, worker.hot_token_id)

    def install_prefill_candidates(self, worker) -> None:
        _capture_full_target_hidden_in_prefill(worker.target_worker)

    def draft_hidden_for_prefill(self, target_hidden_states: Tensor | None) -> Tensor | None:
        return None  # captured for top-K_pre only; the draft never used it


def _prune_head(draft_model, hot_token_id: torch.Tensor) -> None:
    """Give a STANDALONE draft the FR-Spec head its token map implies.

    SGLang's STANDALONE worker keeps the draft's own full LM head (its ``init_lm_head`` is
    a no-op) yet maps every draft top-k index through the token map as if the head had been
    pruned to it, so any index past the map's length fails. The pruned head is a copy: with
    tied embeddings the head module is the embedding, which must keep every row.
    """
    head = copy.copy(draft_model.lm_head)
    head._parameters = dict(head._parameters)  # a shallow copy would share the weight slot
    rows = draft_model.lm_head.weight.data[hot_token_id.to(draft_model.lm_head.weight.device)]
    head.weight = torch.nn.Parameter(rows.clone(), requires_grad=False)
    draft_model.lm_head = head


def _capture_full_target_hidden_in_prefill(target_worker) -> None:
    """STANDALONE runs the target prefill without hidden states; top-K_pre needs them."""
    original = target_worker.forward_batch_generation

    def forward_batch_generation(*args, **kwargs):
        if kwargs.get("capture_hidden_mode") == CaptureHiddenMode.NULL:
            kwargs["capture_hidden_mode"] = CaptureHiddenMode.FULL
        return original(*args, **kwargs)

    target_worker.forward_batch_generation = forward_batch_generation
