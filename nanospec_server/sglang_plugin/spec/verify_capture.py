"""Catch the target's verify logits before SGLang's sampler edits them.

`eagle_sample` applies penalties and grammar masks to the verify logits in place, so the
top-K_ver candidates are taken on the way in; the accepted positions are known on the way
out. An AROUND hook on it (installed by `entry.py`) fills `LAST_VERIFY` for the draft worker,
which consumes it in the same scheduler step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from nanospec_server import ops


@dataclass
class VerifyCandidates:
    tree_tokens: Tensor  # [B, D] every token of the draft tree, root first
    top_tokens: Tensor  # [B, A, K] target top-K_ver at each accepted position
    top_valid: Tensor  # [B, A, K] bool; positions past the accepted length are invalid


class VerifyCapture:
    def __init__(self) -> None:
        self.k_ver = 0
        self.last: VerifyCandidates | None = None
        self.verifies = 0  # SGLang verify samplings run (adaptive speculation reads it)

    def take(self) -> VerifyCandidates | None:
        last, self.last = self.last, None
        return last


LAST_VERIFY = VerifyCapture()


def eagle_sample_hook(original: Callable, verify_input, batch, logits_output, *args, **kwargs):
    batch_size = len(batch.reqs) if batch is not None and batch.reqs is not None else 0
    LAST_VERIFY.verifies += 1
    k = LAST_VERIFY.k_ver
    logits = logits_output.next_token_logits
    top = None
    if batch_size and k > 0 and logits is not None and logits.shape[0] % batch_size == 0:
        top = ops.topk_indices(logits, k)  # before any edit
    result = original(verify_input, batch, logits_output, *args, **kwargs)
    if batch_size and verify_input.draft_token.numel() % batch_size == 0:
        tree = verify_input.draft_token.view(batch_size, -1)
        LAST_VERIFY.last = _accepted_candidates(tree, top, result[2])
    return result


def _accepted_candidates(
    tree: Tensor, top: Tensor | None, accept_index: Tensor
) -> VerifyCandidates:
    batch_size = tree.shape[0]
    if top is None:
        empty = torch.empty(batch_size, 0, 0, dtype=torch.int64, device=tree.device)
        return VerifyCandidates(tree, empty, empty.bool())
    accepted = accept_index.to(torch.int64)  # [B, A] global tree-node rows, -1 padded
    rows = top[accepted.clamp(min=0)]  # [B, A, K]
    valid = (accepted >= 0).unsqueeze(-1).expand_as(rows)
    return VerifyCandidates(tree, rows, valid)
