"""Plain-PyTorch versions of the sgl_kernel CPU ops SGLang's CPU path needs.

Used through the ``sgl_kernel`` stand-in package (see ``nanospec_server.sgl_kernel_cpu.shim``) on hosts where the
real sgl_kernel cannot load; importable on its own for tests.
"""

from .attention import decode_attention, extend_attention
from .kv_cache import (
    assign_draft_cache_locs_contiguous,
    assign_extend_cache_locs,
    assign_req_to_token_pool,
    build_draft_decode_metadata,
    copy_all_layer_kv_cache,
)
from .registry import OPS, register_ops
from .spec_tree import (
    build_tree_kernel_efficient,
    fill_accept_out_cache_loc,
    fill_bonus_tokens,
    verify_tree_greedy,
)

__all__ = [
    "OPS",
    "assign_draft_cache_locs_contiguous",
    "assign_extend_cache_locs",
    "assign_req_to_token_pool",
    "build_draft_decode_metadata",
    "build_tree_kernel_efficient",
    "copy_all_layer_kv_cache",
    "decode_attention",
    "extend_attention",
    "fill_accept_out_cache_loc",
    "fill_bonus_tokens",
    "register_ops",
    "verify_tree_greedy",
]
