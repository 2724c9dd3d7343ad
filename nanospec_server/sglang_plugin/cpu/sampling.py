"""Let EAGLE verify sample (instead of committing the argmax) on CPU.

SGLang's ``eagle_utils._verify_uses_greedy`` forces greedy verification whenever it runs on
CPU, because its sampling verify needs CUDA-only kernels. That silently turns every
temperature > 0 request into greedy decoding once speculation is on. When our stand-in
``torch.ops.sgl_kernel.tree_speculative_sampling_target_only`` is the registered op and
there is no CUDA, ``install_cpu_sampling_hook`` lifts that restriction and fills in what
the sampling branch of ``eagle_sample`` would otherwise find missing on CPU:

* ``tree_speculative_sampling_target_only`` (bound to ``None`` in eagle_utils on CPU),
* ``top_k_renorm_prob`` / ``top_p_renorm_prob`` (also ``None`` on CPU).

Already fine on CPU: the temperature softmax (falls back to ``torch.softmax``) and the
unseeded coins (``torch.rand``). Not handled: ``--speculative-use-rejection-sampling``
(a Triton kernel; such runs stay greedy as before) and the seeded coins of deterministic
inference (``murmur_hash32_cpu``, which plain CPU sampling lacks just the same).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from nanospec_server import seams
from nanospec_server.sgl_kernel_cpu.ops import registry
from nanospec_server.sgl_kernel_cpu.ops.renorm import top_k_renorm_prob, top_p_renorm_prob

__all__ = ["install_cpu_sampling_hook", "stand_in_active"]

logger = logging.getLogger(__name__)

OP_NAME = "tree_speculative_sampling_target_only"


def stand_in_active() -> bool:
    """Our sampling-verify op is the registered one and this host has no CUDA."""
    return registry.defined_here(OP_NAME) and not torch.cuda.is_available()


def tree_sampling_via_dispatcher(*args: object, **kwargs: object) -> None:
    """What eagle_utils calls: go through ``torch.ops`` like a real sgl_kernel op would."""
    getattr(torch.ops.sgl_kernel, OP_NAME)(*args, **kwargs)


def _verify_uses_greedy_hook(
    original: Callable[..., bool], *args: object, **kwargs: object
) -> bool:
    # Rejection sampling would route to a Triton kernel that has no CPU build: stay greedy.
    if kwargs.get("is_cpu") and not kwargs.get("use_rejection_sampling"):
        kwargs["is_cpu"] = False
    return original(*args, **kwargs)


def _bind_missing_ops() -> list[str]:
    """Fill eagle_utils' ``None`` bindings with our ops; return the names bound.

    Attribute seams rather than HookRegistry REPLACEs: the registry propagates a patch
    to every module attribute that ``is`` the original, and for ``None`` that would be
    every unset global in the process.
    """
    wanted = (
        (seams.TREE_SAMPLING_OP, tree_sampling_via_dispatcher),
        (seams.TOP_K_RENORM, top_k_renorm_prob),
        (seams.TOP_P_RENORM, top_p_renorm_prob),
    )
    bound = []
    for seam, fn in wanted:
        if seams.current(seam) is None:
            seams.patch(seam, fn)
            bound.append(seam.attribute)
    return bound


def install_cpu_sampling_hook() -> bool:
    """Make EAGLE verify sample on CPU when our stand-in op serves it. Returns whether it
    did; a no-op (False) on CUDA hosts or where a real sgl_kernel provides the op.

    Registers the hook and applies it (HookRegistry skips targets already patched, so
    calling this before another ``apply_hooks()`` is harmless). Idempotent.
    """
    if not stand_in_active():
        return False
    if getattr(install_cpu_sampling_hook, "done", False):
        return True
    install_cpu_sampling_hook.done = True  # type: ignore[attr-defined]
    bound = _bind_missing_ops()
    seams.hook(seams.VERIFY_USES_GREEDY, _verify_uses_greedy_hook)
    seams.apply()
    logger.info("nanospec: EAGLE verify samples on CPU (stand-in ops: %s)", ", ".join(bound))
    return True
