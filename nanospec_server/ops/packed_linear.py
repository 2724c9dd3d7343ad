"""fp32 linear layers on CPU through oneDNN, with weights packed once.

``F.linear``'s small-M GEMM repacks the whole weight on every call; oneDNN's linear reads
a weight packed once as it is. Measured on this 2-core AVX2 host: a 5-token verify of the
0.5B target costs ~1.5x a one-token decode packed against ~2.9x with ``F.linear``
(``benchmarks/cpu_linear.py``), and an 896 x 4864 linear at 128 rows takes ~17 ms packed
against ~25 ms (one thread). A row's result does not depend on how many rows share the
call (``F.linear``'s GEMV and GEMM round differently), which token-identical speculative
decoding needs. Used by SGLang's linear layers (``sglang_plugin/cpu_linear.py``) and by
the trainer's answering target (``train/run.py``). Inference only: no autograd.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

# oneDNN's blocking for up to this many rows; results stay identical for any row count.
PACK_BATCH_HINT = 8


def available() -> bool:
    return torch.backends.mkldnn.is_available()


def packable(weight: Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2


def pack(weight: Tensor) -> Tensor:
    """The weight [N, K] in oneDNN's blocked layout (an opaque mkldnn tensor)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PACK_BATCH_HINT)


def packed_linear(x: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    """``F.linear(x, W, bias)`` for W packed by ``pack``; any leading shape."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")
    return out.view(*x.shape[:-1], out.shape[-1])


class PackedLinear(nn.Module):
    """A frozen ``nn.Linear`` whose weight is packed for oneDNN."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = pack(linear.weight)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: Tensor) -> Tensor:
        return packed_linear(x, self.packed, self.bias)


def pack_linear_layers(model: nn.Module) -> int:
    """Swap every fp32 CPU ``nn.Linear`` of a frozen ``model`` for a ``PackedLinear``.

    A layer tied to an embedding (Qwen2.5-0.5B's LM head) gets a packed copy beside the
    embedding's rows; untied weights are dropped with their module. Returns how many
    layers were swapped (0 where oneDNN is missing).
    """
    if not available():
        return 0
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear) and packable(child.weight)
    ]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child))
    return len(swaps)
