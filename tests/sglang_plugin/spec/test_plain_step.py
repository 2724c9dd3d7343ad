"""`plain_step.argmax_from_top`: a plain step's greedy tokens read from its top-k pass equal
the sampler's argmax, and a row with nothing to pick leaves the step to the sampler (whose
guard ends that request)."""

import torch

from nanospec_server import ops
from nanospec_server.sglang_plugin.spec.plain_step import argmax_from_top


def test_greedy_tokens_from_the_top_k_are_the_argmax():
    logits = torch.randn(6, 4096)
    logits[1, [7, 900]] = 50.0  # a tie: the lowest index, as torch.argmax
    logits[2, 3000] = float("inf")
    logits[3, :100] = float("-inf")
    top, tokens = argmax_from_top(logits, 3)
    assert torch.equal(top, ops.topk_indices(logits, 3))  # the window's candidates
    assert torch.equal(tokens, torch.argmax(logits, dim=-1))
    assert tokens[1] == 7


def test_a_row_with_nothing_to_pick_leaves_the_step_to_the_sampler():
    for broken in (float("nan"), float("-inf")):
        logits = torch.randn(3, 512)
        if broken != broken:
            logits[1, 17] = broken
        else:
            logits[1] = broken
        top, tokens = argmax_from_top(logits, 3)
        assert tokens is None and top.shape == (3, 3)
