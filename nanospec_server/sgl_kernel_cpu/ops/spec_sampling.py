"""EAGLE tree verification by sampling: plain-PyTorch stand-in for sgl_kernel's
``tree_speculative_sampling_target_only`` (SGLang only ships a CUDA build of it).

Semantics, per request ``b`` (the same as SGLang's CUDA kernel; the draft is treated as a
point mass on each child token, so ``draft_probs`` only records rejected mass):

1. Start at the root (node 0) with coin ``u = uniform_samples[b, 0]``.
2. Visit the current node's children in sibling order, keeping a running sum ``acc`` of
   ``target_probs[b, cur, token(child)]``. Accept the first child whose own probability
   ``p`` is positive and for which ``u < acc / threshold_acc`` or ``p >= threshold_single``.
   A rejected child's mass is recorded as ``draft_probs[b, cur, token] = p``.
3. On acceptance write ``predicts[row(cur)] = token(child)``, record ``row(child)`` in
   ``accept_index``, move to the child, take ``u = uniform_samples[b, child]``, reset
   ``acc`` and repeat from 2 until no child is accepted or ``accept_index`` is full.
4. Bonus token: sample from ``relu(target_probs[b, cur] - draft_probs[b, cur])``
   (``draft_probs`` ignored when ``accept_index`` filled up: those children were never
   tried) by inverse CDF with ``uniform_samples_for_final_sampling[b]``; write it to
   ``predicts[row(cur)]``. ``accept_token_num[b]`` = number of accepted draft tokens.

Why this keeps the target distribution when both thresholds are 1: one coin against the
cumulative sums accepts sibling ``k`` exactly when ``acc_{k-1} <= u < acc_k``, i.e. with
probability ``p(x_k)``; that is the same as "accept ``x`` with probability ``p(x)``, else
zero ``p(x)``, renormalise and try the next sibling". If no sibling is accepted, the bonus
token comes from ``p`` with every tried sibling removed, renormalised. So every token ``x``
is emitted with probability ``p(x)`` (siblings carry distinct tokens, as EAGLE's top-k
expansion guarantees).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["tree_speculative_sampling_target_only"]


def tree_speculative_sampling_target_only(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    uniform_samples_for_final_sampling: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    threshold_single: float = 1.0,
    threshold_acc: float = 1.0,
    deterministic: bool = True,
) -> None:
    """Verify each request's draft tree by sampling (see the module docstring).

    Shapes: ``candidates``, ``retrive_*``, ``uniform_samples``: [bs, n];
    ``target_probs``/``draft_probs``: [bs, n, vocab]; ``accept_index``: [bs, max_accept];
    ``predicts``: [bs * n]. Writes ``predicts``, ``accept_index[b, :1 + accepted]``,
    ``accept_token_num`` and the rejected cells of ``draft_probs`` in place.
    ``deterministic`` is accepted for signature compatibility: this version always is.
    """
    del deterministic
    if not (0.0 <= threshold_single <= 1.0 and 0.0 <= threshold_acc <= 1.0):
        raise ValueError(f"thresholds must lie in [0, 1], got {threshold_single}, {threshold_acc}")
    bs, n = candidates.shape
    if bs == 0:
        return
    vocab = target_probs.shape[-1]
    probs = target_probs.reshape(bs, n, vocab)
    drafts = draft_probs.view(bs, n, vocab)
    walk = _walk_trees(
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        uniform_samples,
        probs,
        max_accept=accept_index.shape[1],
        threshold_single=threshold_single,
        threshold_acc=threshold_acc,
    )
    for b, rows in enumerate(walk.accept_rows):
        accept_index[b, : len(rows)] = torch.tensor(rows, dtype=accept_index.dtype)
    accept_token_num.copy_(
        torch.tensor([len(rows) - 1 for rows in walk.accept_rows], dtype=accept_token_num.dtype)
    )
    if walk.rejected:
        rb, rn, rt = (
            torch.tensor(col, dtype=torch.int64) for col in zip(*walk.rejected, strict=True)
        )
        drafts[rb, rn, rt] = probs[rb, rn, rt].to(drafts.dtype)

    # The bonus draw runs in float64: a block-reduced float32 sum cannot be matched bit for
    # bit anyway, and the extra precision only narrows the coin-past-the-CDF fallback.
    batch = torch.arange(bs)
    final_nodes = torch.tensor(walk.final_nodes, dtype=torch.int64)
    target_rows = probs[batch, final_nodes].double()
    draft_rows = drafts[batch, final_nodes].double()
    draft_rows[torch.tensor(walk.budget_used, dtype=torch.bool)] = 0.0
    bonus = _sample_residual(
        (target_rows - draft_rows).clamp_min(0.0),
        uniform_samples_for_final_sampling.reshape(bs).double(),
    )
    flat = predicts.view(-1)
    if walk.predict_rows:
        flat[torch.tensor(walk.predict_rows, dtype=torch.int64)] = torch.tensor(
            walk.predict_tokens, dtype=flat.dtype
        )
    flat[torch.tensor(walk.final_rows, dtype=torch.int64)] = bonus.to(flat.dtype)


class _Walk:
    """What the per-request tree walks decided, as Python lists for batched write-back."""

    def __init__(self) -> None:
        self.accept_rows: list[list[int]] = []  # per request: root row, then accepted rows
        self.predict_rows: list[int] = []  # predicts[row] = token for each accepted step
        self.predict_tokens: list[int] = []
        self.rejected: list[tuple[int, int, int]] = []  # (request, node, token) tried, refused
        self.final_nodes: list[int] = []  # node whose distribution yields the bonus token
        self.final_rows: list[int] = []
        self.budget_used: list[bool] = []  # accept_index filled: no sibling was ever tried


def _walk_trees(
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    uniform_samples: torch.Tensor,
    probs: torch.Tensor,
    *,
    max_accept: int,
    threshold_single: float,
    threshold_acc: float,
) -> _Walk:
    bs, n = candidates.shape
    tokens = candidates.to(torch.int64)
    # child_probs[b, r, c]: target probability of node c's token at node r, every value
    # the walk can read. Kept in float32 (numpy scalars) so the running sums and coin
    # comparisons round exactly like the CUDA kernel's.
    child_probs = torch.gather(probs.float(), 2, tokens.unsqueeze(1).expand(bs, n, n)).cpu().numpy()
    coins = uniform_samples.reshape(bs, n).float().cpu().numpy()
    single = np.float32(threshold_single)
    acc_div = np.float32(max(np.float32(threshold_acc), np.float32(1e-9)))
    cand = tokens.tolist()
    rindex = retrive_index.reshape(bs, n).tolist()
    rnext = retrive_next_token.reshape(bs, n).tolist()
    rsib = retrive_next_sibling.reshape(bs, n).tolist()

    walk = _Walk()
    for b in range(bs):
        node = 0
        rows = [rindex[b][0]]
        coin = coins[b, 0]
        while len(rows) < max_accept:
            acc = np.float32(0.0)
            child = rnext[b][node]
            while child != -1:
                p = child_probs[b, node, child]
                acc = np.float32(acc + p)
                if p > 0 and (coin < acc / acc_div or p >= single):
                    break
                walk.rejected.append((b, node, cand[b][child]))
                child = rsib[b][child]
            if child == -1:
                break
            walk.predict_rows.append(rows[-1])
            walk.predict_tokens.append(cand[b][child])
            rows.append(rindex[b][child])
            node = child
            coin = coins[b, child]
        walk.accept_rows.append(rows)
        walk.final_nodes.append(node)
        walk.final_rows.append(rows[-1])
        walk.budget_used.append(len(rows) == max_accept)
    return walk


def _sample_residual(residual: torch.Tensor, coins: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sample per row of the unnormalised ``residual`` [bs, vocab].

    Picks the first positive entry whose running sum exceeds ``coin * total``. When
    rounding leaves the coin past the last bucket, falls back to the last positive entry,
    or to the last token if the row has no mass at all (the CUDA kernel does the same).
    """
    vocab = residual.shape[-1]
    threshold = coins * residual.sum(dim=-1)
    positive = residual > 0
    hit = (residual.cumsum(dim=-1) > threshold.unsqueeze(-1)) & positive
    first_hit = hit.int().argmax(dim=-1)  # argmax returns the first maximal index
    last_positive = vocab - 1 - positive.flip(-1).int().argmax(dim=-1)
    fallback = torch.where(
        positive.any(dim=-1), last_positive, torch.full_like(last_positive, vocab - 1)
    )
    return torch.where(hit.any(dim=-1), first_hit, fallback)
