"""Top-k next-token predictions of the target over a whole prompt, in bounded memory."""

import torch
from torch import Tensor

from nanospec_server import ops


def topk_tokens_in_chunks(hidden: Tensor, weight: Tensor, k: int, chunk: int = 256) -> Tensor:
    """Top-k token ids [T, k] of ``hidden`` [T, d] @ ``weight`` [V, d].T.

    Logits are materialised ``chunk`` positions at a time, so peak memory is chunk x V
    however long the prompt is.
    """
    k = min(k, weight.shape[0])
    out = torch.empty(hidden.shape[0], k, dtype=torch.int64, device=hidden.device)
    for start in range(0, hidden.shape[0], chunk):
        logits = hidden[start : start + chunk].to(weight.dtype) @ weight.T
        out[start : start + chunk] = ops.topk_indices(logits, k)
    return out
