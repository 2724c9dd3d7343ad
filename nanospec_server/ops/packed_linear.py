"""fp32 and bf16 linear layers on CPU through oneDNN, with weights packed once.

``F.linear``'s small-M GEMM repacks the whole weight on every call; oneDNN's linear reads
a weight packed once as it is, so a verify pass costs little more than a one-token
decode (``benchmarks/cpu_linear.py``; docs/results.md, "The CPU path").
Used by SGLang's linear layers (``sglang_plugin/cpu/linear.py``)
and by the trainer's answering target (``train/run.py``). Inference only: no autograd.

Row invariance: a row's result must not depend on how many rows share the call, or a
verify pass would not compute the logits a one-token decode computes for the same position
(``F.linear``'s GEMV and GEMM round differently), nor would a prompt prefilled beside
others compute what it computes alone. oneDNN chooses its kernel by the row count, the
input width and the batch size the weight was packed for, and kernels reduce the input
features in different orders: above 1024 features a one-row fp32 call differs from a
many-row one; on a CPU with AMX, a bf16 weight packed for 8 rows computes calls of up to 32
rows in one kernel and larger ones (a verify of 8 requests, a prefill) in another, and
only one packed for a single row computes every row count alike (while an fp32 weight
packed so does not). So the weight is packed in column blocks of at most ``layout().width``
input features, for oneDNN's ``batch_hint``, each block row-invariant, and their partial
products are summed in a fixed order: a row's arithmetic is then the same at any row
count. The layout is the fastest that passes a probe on this host over row counts from
decode to prefill sizes, found once per process and dtype.

bf16 weights take oneDNN's bf16 kernel where the CPU has a native bf16 dot product (AMX,
AVX512-BF16): fp32 accumulation inside a block, the blocks' bf16 results summed in fp32 and
rounded once. Elsewhere bf16 has no fast kernel anyway, and the weight is packed as fp32:
the same row-invariant fp32 arithmetic, its result rounded to bf16 (twice the memory of
those weights; fp32 stays the default there).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nanospec_server.env import cpu_linear

logger = logging.getLogger(__name__)

# The layouts the row-invariance probe tries, fastest first: input-feature blocks widest
# first, each packed for oneDNN's blocking of 8 rows, then of one row (slower for a verify
# or a prefill on an AMX host: ~1.3x at 40 rows, ~1.2x at 512).
K_BLOCK_CANDIDATES = (1024, 512, 256, 128, 64)
BATCH_HINTS = (8, 1)
# The row counts the probe compares with one row: decodes, verifies, prefills.
PROBE_ROWS = (2, 3, 5, 9, 17, 33, 40, 65, 130, 257)
PROBE_OUT_FEATURES = 1536  # a narrow weight (256 rows) passed where every wider one failed


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
    """A weight [N, K] as oneDNN-packed column blocks [N, <= layout().width] (opaque tensors),
    computing in ``compute_dtype`` and returning ``dtype`` (the weight's own)."""

    blocks: tuple[Tensor, ...]
    block_width: int
    out_features: int
    in_features: int
    dtype: torch.dtype
    compute_dtype: torch.dtype


@dataclass(frozen=True)
class BlockLayout:
    """How a weight is packed: column blocks of ``width`` input features, for oneDNN's
    blocking of ``batch_hint`` rows."""

    width: int
    batch_hint: int


def _pack_block(weight: Tensor, batch_hint: int) -> Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), batch_hint)


def _linear_block(x: Tensor, block: Tensor, bias: Tensor | None) -> Tensor:
    """One oneDNN call: contiguous rows ``x`` times a block packed by ``_pack_block``."""
    return torch.ops.mkldnn._linear_pointwise(x, block, bias, "none", [], "")


def row_invariant(candidate: BlockLayout, dtype: torch.dtype = torch.float32) -> bool:
    """Does a call of each of ``PROBE_ROWS`` rows compute, for every row, what a one-row
    call computes for it?"""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(PROBE_OUT_FEATURES, candidate.width, generator=gen).to(dtype)
    block = _pack_block(weight, candidate.batch_hint)
    x = torch.randn(max(PROBE_ROWS), candidate.width, generator=gen).to(dtype)
    alone = torch.cat([_linear_block(x[i : i + 1], block, None) for i in range(len(x))])
    return all(
        torch.equal(_linear_block(x[:rows], block, None), alone[:rows]) for rows in PROBE_ROWS
    )


@functools.cache
def layout(dtype: torch.dtype = torch.float32) -> BlockLayout:
    """The fastest block layout whose packed linear in ``dtype`` (a compute dtype) is
    row-invariant on this host."""
    for width in K_BLOCK_CANDIDATES:
        for hint in BATCH_HINTS:
            if row_invariant(candidate := BlockLayout(width, hint), dtype):
                return candidate
    logger.warning("no packed %s layout is row-invariant on this CPU: a verify may round "
                   "apart from a decode", dtype)  # fmt: skip
    return BlockLayout(K_BLOCK_CANDIDATES[-1], BATCH_HINTS[0])  # still correct


def pack(weight: Tensor) -> OneDnnWeight:
    """The weight [N, K] in oneDNN's blocked layout, in row-invariant column blocks."""
    dtype, computes = weight.dtype, compute_dtype(weight.dtype)
    weight = weight.detach().to(computes)
    chosen = layout(computes)
    width = chosen.width
    blocks = tuple(
        _pack_block(weight[:, start : start + width], chosen.batch_hint)
        for start in range(0, weight.shape[1], width)
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
