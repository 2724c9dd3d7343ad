"""fp32 and bf16 linear layers on CPU through oneDNN, with weights packed once.

``F.linear``'s small-M GEMM repacks the whole weight on every call; oneDNN's linear reads
a weight packed once as it is, so a verify pass costs little more than a one-token
decode (``benchmarks/cpu_linear.py``; docs/results.md, "The CPU path").
Used by SGLang's linear layers (``sglang_plugin/cpu/linear.py``)
and by the trainer's answering target (``train/run.py``). Inference only: no autograd.

Row invariance: a row's result must not depend on how many rows share the call, or a
verify pass would not compute the logits a one-token decode computes for the same position
(``F.linear``'s GEMV and GEMM round differently). oneDNN keeps that for any row count up to
an input width of 1024 on this host, but above it a one-row call reduces the input features
in another order than a many-row call (at 1536 wide, every row count from 2 up agrees and
one row differs). So the weight is packed in column blocks of at most ``k_block()``
input features, each row-invariant, and their partial products are summed in a fixed
order: a row's arithmetic is then the same at any row count. The block is the widest that
passes a probe on this host (1024 here), found once per process and dtype.

bf16 weights take oneDNN's bf16 kernel where the CPU has a native bf16 dot product (AMX,
AVX512-BF16): fp32 accumulation inside a block, the blocks' bf16 results summed in fp32 and
rounded once. Elsewhere bf16 has no fast kernel anyway, and the weight is packed as fp32:
the same row-invariant fp32 arithmetic, its result rounded to bf16 (twice the memory of
those weights; fp32 stays the default there).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nanospec_server.env import cpu_linear

# oneDNN's blocking for up to this many rows; results stay identical for any row count.
PACK_BATCH_HINT = 8
# Input-feature blocks tried, widest first, by the row-invariance probe.
K_BLOCK_CANDIDATES = (1024, 512, 256, 128, 64)


def available() -> bool:
    return torch.backends.mkldnn.is_available()


def enabled() -> bool:
    """Whether SGLang's fp32 and bf16 CPU linear layers run packed: oneDNN present and not
    turned off."""
    return cpu_linear() and available()


PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def packable(weight: Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype in PACKABLE_DTYPES and weight.dim() == 2


@functools.cache
def native_bf16() -> bool:
    """Whether bf16 weights run oneDNN's bf16 kernel here (a native bf16 dot product)."""
    return torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a packed weight of ``dtype`` computes in."""
    return torch.bfloat16 if dtype == torch.bfloat16 and native_bf16() else torch.float32


@dataclass(frozen=True)
class OneDnnWeight:
    """A weight [N, K] as oneDNN-packed column blocks [N, <= k_block()] (opaque tensors),
    computing in ``compute_dtype`` and returning ``dtype`` (the weight's own)."""

    blocks: tuple[Tensor, ...]
    block_width: int
    out_features: int
    in_features: int
    dtype: torch.dtype
    compute_dtype: torch.dtype


def _pack_block(weight: Tensor) -> Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACK_BATCH_HINT)


def _linear_block(x: Tensor, block: Tensor, bias: Tensor | None) -> Tensor:
    """One oneDNN call: contiguous rows ``x`` times a block packed by ``_pack_block``."""
    return torch.ops.mkldnn._linear_pointwise(x, block, bias, "none", [], "")


def _one_row_matches_many(width: int, dtype: torch.dtype = torch.float32) -> bool:
    """Does a one-row call compute what a three-row call computes for the same row?"""
    gen = torch.Generator().manual_seed(0)
    weight = _pack_block(torch.randn(256, width, generator=gen).to(dtype))
    x = torch.randn(3, width, generator=gen).to(dtype)
    return torch.equal(_linear_block(x, weight, None)[1:2], _linear_block(x[1:2], weight, None))


@functools.cache
def k_block(dtype: torch.dtype = torch.float32) -> int:
    """The widest input-feature block whose packed linear in ``dtype`` (a compute dtype)
    is row-invariant on this host."""
    for width in K_BLOCK_CANDIDATES:
        if _one_row_matches_many(width, dtype):
            return width
    return K_BLOCK_CANDIDATES[-1]  # no width passes: still correct, only not row-invariant


def pack(weight: Tensor) -> OneDnnWeight:
    """The weight [N, K] in oneDNN's blocked layout, in row-invariant column blocks."""
    dtype, computes = weight.dtype, compute_dtype(weight.dtype)
    weight = weight.detach().to(computes)
    width = k_block(computes)
    blocks = tuple(
        _pack_block(weight[:, start : start + width]) for start in range(0, weight.shape[1], width)
    )
    return OneDnnWeight(blocks, width, weight.shape[0], weight.shape[1], dtype, computes)


def row_bucket(rows: int) -> int:
    """The row count a call computes: ``rows`` rounded up to one of ~90 sizes up to 4096.

    oneDNN keeps a primitive per (weight shape, row count) it has seen, up to 1024 of them,
    ~0.4 MB each even for a tiny weight: a server seeing every row count from 1 to 400 grew
    by ~650 MB, and its memory never settled. Since a row's result does not depend on the
    rows beside it, zero rows can pad a call to a few sizes (that grew by ~60 MB). Up to 8
    rows (decodes, small verifies) stay exact, where padding would cost most.
    """
    if rows <= 8:
        return rows
    step = 8 if rows <= 128 else 64
    return -(-rows // step) * step


def packed_linear(x: Tensor, packed: OneDnnWeight, bias: Tensor | None) -> Tensor:
    """``F.linear(x, W, bias)`` for W packed by ``pack``; any leading shape, ``x``'s dtype."""
    flat = x.reshape(-1, x.shape[-1]).to(packed.compute_dtype)
    if bias is not None:
        bias = bias.to(packed.compute_dtype)
    rows = flat.shape[0]
    padded = row_bucket(rows)
    if padded != rows:
        flat = torch.cat([flat, flat.new_zeros(padded - rows, flat.shape[1])])
    width = packed.block_width
    out = None
    for index, block in enumerate(packed.blocks):
        part_x = flat[:, index * width : (index + 1) * width].contiguous()
        # The bias joins the first block only, so it is added once, in a fixed place.
        part_bias = bias if index == 0 else None
        part = _linear_block(part_x, block, part_bias)
        if out is None:
            out = part if len(packed.blocks) == 1 else part.float()
        else:  # bf16 blocks are summed in fp32, in block order
            out.add_(part)
    return out[:rows].view(*x.shape[:-1], packed.out_features).to(x.dtype)


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
        if isinstance(child, nn.Linear)
        and child.weight.dtype == torch.float32
        and packable(child.weight)
    ]
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child))
    return len(swaps)
