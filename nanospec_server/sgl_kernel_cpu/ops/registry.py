"""Register the plain-PyTorch ops as ``torch.ops.sgl_kernel.*``.

SGLang's CPU path looks some ops up through the dispatcher (``torch.ops.sgl_kernel.X``)
and imports others from the ``sgl_kernel`` module; this module covers the former. It only
defines ops that no other library has defined, so it never shadows a real sgl_kernel.
Deliberately NOT defined: ``convert_weight_packed`` and friends, whose presence makes
SGLang assume the AMX weight-packing kernels exist.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from . import attention, kv_cache, spec_sampling, spec_tree

__all__ = ["OPS", "defined_here", "register_ops"]

_NAMESPACE = "sgl_kernel"

# name -> (schema after the name, implementation). "(a!)" marks arguments written in place.
OPS: dict[str, tuple[str, Callable[..., object]]] = {
    "decode_attention_cpu": (
        "(Tensor query, Tensor(a!) k_cache, Tensor(b!) v_cache, float key_scale, "
        "float value_scale, Tensor(c!) output, Tensor? key, Tensor? value, Tensor? loc, "
        "Tensor(d!) attn_logits, Tensor req_to_token, Tensor req_pool_indices, "
        "Tensor seq_lens, float sm_scale, float logit_cap, bool is_cross_attn, "
        "int sliding_window_size, Tensor? encoder_lens, Tensor? sinks) -> ()",
        attention.decode_attention,
    ),
    "extend_attention_cpu": (
        "(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, Tensor(a!) o_extend, "
        "Tensor k_buffer, Tensor v_buffer, float key_scale, float value_scale, "
        "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
        "Tensor extend_seq_lens, Tensor extend_start_loc, int? max_len_extend, "
        "float sm_scale, float logit_cap, bool is_cross_attn, int sliding_window_size, "
        "Tensor? encoder_lens, Tensor? sinks, Tensor? tree_mask, bool is_causal) -> ()",
        attention.extend_attention,
    ),
    "assign_req_to_token_pool_cpu": (
        "(Tensor req_pool_indices, Tensor(a!) req_to_token, Tensor start_offset, "
        "Tensor end_offset, Tensor out_cache_loc, int pool_len) -> ()",
        kv_cache.assign_req_to_token_pool,
    ),
    "assign_extend_cache_locs_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor start_offset, "
        "Tensor end_offset, Tensor(a!) out_cache_loc, int pool_len) -> ()",
        kv_cache.assign_extend_cache_locs,
    ),
    "assign_draft_cache_locs_contiguous_cpu": (
        "(Tensor req_pool_indices, Tensor req_to_token, Tensor seq_lens, "
        "Tensor(a!) out_cache_loc, int pool_len, int topk, int num_cols) -> ()",
        kv_cache.assign_draft_cache_locs_contiguous,
    ),
    "copy_all_layer_kv_cache_cpu": (
        "(Tensor data_ptrs, Tensor strides, Tensor tgt_loc, Tensor src_loc) -> ()",
        kv_cache.copy_all_layer_kv_cache,
    ),
    "build_draft_decode_metadata_cpu": (
        "(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, int topk, "
        "int num_steps, int pool_len) -> Tensor",
        kv_cache.build_draft_decode_metadata,
    ),
    "build_tree_kernel_efficient_cpu": (
        "(Tensor parent_list, Tensor selected_index, Tensor verified_seq_len, "
        "Tensor(a!) tree_mask, Tensor(b!) positions, Tensor(c!) retrieve_index, "
        "Tensor(d!) retrieve_next_token, Tensor(e!) retrieve_next_sibling, int topk, "
        "int depth, int draft_token_num, int tree_mask_mode) -> ()",
        spec_tree.build_tree_kernel_efficient,
    ),
    "verify_tree_greedy_cpu": (
        "(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, "
        "Tensor candidates, Tensor retrive_index, Tensor retrive_next_token, "
        "Tensor retrive_next_sibling, Tensor target_predict) -> ()",
        spec_tree.verify_tree_greedy,
    ),
    "fill_bonus_tokens_cpu": (
        "(Tensor accept_tokens, Tensor accept_lens, Tensor(a!) bonus_tokens, "
        "int accept_stride) -> ()",
        spec_tree.fill_bonus_tokens,
    ),
    "fill_accept_out_cache_loc_cpu": (
        "(Tensor accept_index, Tensor out_cache_loc, Tensor(a!) accept_out_cache_loc) -> ()",
        spec_tree.fill_accept_out_cache_loc,
    ),
    # No "_cpu" suffix: SGLang's CUDA/MUSA paths use this very name.
    "tree_speculative_sampling_target_only": (
        "(Tensor(a!) predicts, Tensor(b!) accept_index, Tensor(c!) accept_token_num, "
        "Tensor candidates, Tensor retrive_index, Tensor retrive_next_token, "
        "Tensor retrive_next_sibling, Tensor uniform_samples, "
        "Tensor uniform_samples_for_final_sampling, Tensor target_probs, "
        "Tensor(d!) draft_probs, float threshold_single=1.0, float threshold_acc=1.0, "
        "bool deterministic=True) -> ()",
        spec_sampling.tree_speculative_sampling_target_only,
    ),
}

# Kept alive for the life of the process: dropping a Library object unregisters its ops.
_library: torch.library.Library | None = None
_defined: set[str] = set()  # names this module put into the dispatcher


def defined_here(name: str) -> bool:
    """True if ``torch.ops.sgl_kernel.<name>`` is our stand-in (not a real kernel's op)."""
    return name in _defined


def _already_defined(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"{_NAMESPACE}::{name}", "")
    except RuntimeError:
        return False
    return True


def register_ops() -> list[str]:
    """Define and implement every op in ``OPS`` not yet known to the dispatcher.

    Idempotent; returns the names registered by this call.
    """
    global _library
    if _library is None:
        _library = torch.library.Library(_NAMESPACE, "FRAGMENT")
    added = []
    for name, (schema, fn) in OPS.items():
        if _already_defined(name):
            continue
        _library.define(name + schema)
        # CompositeExplicitAutograd: one Python kernel for every device; these ops
        # are never differentiated.
        _library.impl(name, fn, "CompositeExplicitAutograd")
        added.append(name)
    _defined.update(added)
    return added
