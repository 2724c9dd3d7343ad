"""fp32 and bf16 linear layers and LM heads on CPU through oneDNN with prepacked weights.

Why: speculative decoding pays only if verifying k tokens costs little more than decoding
one. On a CPU without AMX, SGLang's linear layers run ``F.linear``, whose small-M GEMM
repacks the whole weight on every call, so a verify pass costs several one-token decodes
(bf16 has no fast kernel on AVX2 either) and speculation barely breaks even. oneDNN's
linear over a weight packed once at load reads the packed weight as it is, and a verify
costs little more than a decode (``benchmarks/cpu_linear.py``; docs/results.md,
"The CPU path").

Also why: packed rows are batch-invariant (``ops/packed_linear.py``), so a verify pass and
a one-token decode compute the same logits for the same position.

Scope: CPU tensors in float32 and bfloat16 (bf16 computes in bf16 where the CPU has a
native bf16 dot product, else in fp32: ``ops/packed_linear.py``). SGLang's own AMX kernels
never serve here: our ``sgl_kernel`` stand-in leaves out the weight packing that would turn
them on. Linear layers are packed in place at load (no second copy); an unquantized LM head is packed on first use, once per
distinct weight (the EAGLE draft shares the target's), beside the embedding that still
needs the plain rows. ``NANOSPEC_CPU_LINEAR=0`` turns it off.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch
from torch import Tensor

from nanospec_server import seams
from nanospec_server.ops.packed_linear import (
    OneDnnWeight,
    enabled,
    pack,
    packable,
    packed_linear,
)

logger = logging.getLogger(__name__)


def after_loading_hook(original: Callable, method, layer: torch.nn.Module) -> None:
    """AROUND ``UnquantizedLinearMethod.process_weights_after_loading``: pack in place."""
    original(method, layer)
    weight = getattr(layer, "weight", None)
    if weight is not None and packable(weight):
        layer.nanospec_packed = pack(weight)
        # The plain rows are freed; what stays under `weight` keeps its shape, dtype and
        # device for code that reads them, and holds no memory.
        placeholder = torch.empty((), dtype=weight.dtype).expand(weight.shape)
        layer.weight = torch.nn.Parameter(placeholder, requires_grad=False)


def apply_hook(original: Callable, method, layer, x: Tensor, bias: Tensor | None = None):
    """AROUND ``UnquantizedLinearMethod.apply``: the packed kernel for packed layers."""
    packed = getattr(layer, "nanospec_packed", None)
    if packed is not None and x.dtype == packed.dtype:
        return packed_linear(x, packed, bias)
    return original(method, layer, x, bias)


class PackedHeads:
    """One packed copy per distinct LM-head weight, made on first use."""

    def __init__(self) -> None:
        self.by_weight: dict[tuple[int, tuple[int, ...]], OneDnnWeight] = {}

    def get(self, weight: Tensor) -> OneDnnWeight:
        key = (weight.data_ptr(), tuple(weight.shape))
        if key not in self.by_weight:
            self.by_weight[key] = pack(weight)
            logger.info("nanospec: LM head %s packed for oneDNN", list(weight.shape))
        return self.by_weight[key]


PACKED_HEADS = PackedHeads()


@functools.cache
def _quantized_head_check() -> Callable:
    """SGLang's own test for an LM head its quant method computes (looked up once, not on
    every logits call)."""
    from sglang.srt.layers.logits_processor import should_apply_lm_head_quant_method

    return should_apply_lm_head_quant_method


def lm_head_hook(original: Callable, processor, hidden: Tensor, lm_head, *args, **kwargs):
    """AROUND ``LogitsProcessor._compute_lm_head``: plain fp32 and bf16 CPU heads use the
    packed kernel; LoRA, quantized, biased and our own packed draft heads go the original way."""
    bias = args[0] if args else kwargs.get("embedding_bias")
    weight = getattr(lm_head, "weight", None)
    plain = (
        weight is not None
        and bias is None
        and not hasattr(lm_head, "set_lora")
        and not _quantized_head_check()(lm_head, getattr(lm_head, "quant_method", None))
        and hidden.dtype == weight.dtype
        and packable(weight)
    )
    if not plain:
        return original(processor, hidden, lm_head, *args, **kwargs)
    return packed_linear(hidden, PACKED_HEADS.get(weight), None)


def install_cpu_linear_hooks() -> bool:
    """Register the hooks (the caller applies them). Returns whether it did."""
    if not enabled():
        return False
    seams.hook(seams.LINEAR_AFTER_LOADING, after_loading_hook)
    seams.hook(seams.LINEAR_APPLY, apply_hook)
    seams.hook(seams.LM_HEAD, lm_head_hook)
    logger.info("nanospec: fp32/bf16 CPU linear layers and LM heads use oneDNN packed weights")
    return True
