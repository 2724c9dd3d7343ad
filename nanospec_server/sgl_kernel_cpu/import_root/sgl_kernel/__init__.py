"""nanospec's stand-in for ``sgl_kernel`` on CPU hosts without the real package.

Only on sys.path when ``nanospec_server.sgl_kernel_cpu.shim.activate_shim`` decides the
real sgl_kernel cannot load and CUDA is absent. Importing it registers the plain-PyTorch ops
as ``torch.ops.sgl_kernel.*`` and exposes them under the names SGLang imports.
"""

from nanospec_server.sgl_kernel_cpu.ops import (
    assign_draft_cache_locs_contiguous as assign_draft_cache_locs_contiguous_cpu,
)
from nanospec_server.sgl_kernel_cpu.ops import (
    assign_extend_cache_locs as assign_extend_cache_locs_cpu,
)
from nanospec_server.sgl_kernel_cpu.ops import (
    assign_req_to_token_pool as assign_req_to_token_pool_cpu,
)
from nanospec_server.sgl_kernel_cpu.ops import (
    build_draft_decode_metadata as build_draft_decode_metadata_cpu,
)
from nanospec_server.sgl_kernel_cpu.ops import (
    build_tree_kernel_efficient as build_tree_kernel_efficient_cpu,
)
from nanospec_server.sgl_kernel_cpu.ops import (
    copy_all_layer_kv_cache as copy_all_layer_kv_cache_cpu,
)
from nanospec_server.sgl_kernel_cpu.ops import (
    decode_attention as decode_attention_cpu,
)
from nanospec_server.sgl_kernel_cpu.ops import (
    extend_attention as extend_attention_cpu,
)
from nanospec_server.sgl_kernel_cpu.ops import (
    fill_accept_out_cache_loc as fill_accept_out_cache_loc_cpu,
)
from nanospec_server.sgl_kernel_cpu.ops import (
    fill_bonus_tokens as fill_bonus_tokens_cpu,
)
from nanospec_server.sgl_kernel_cpu.ops import register_ops as _register_ops
from nanospec_server.sgl_kernel_cpu.ops import (
    verify_tree_greedy as verify_tree_greedy_cpu,
)
from nanospec_server.sgl_kernel_cpu.ops.spec_sampling import (
    tree_speculative_sampling_target_only,
)

# Marks this package as the stand-in (a real sgl_kernel never has this attribute).
IS_NANOSPEC_SHIM = True
__version__ = "0.0.0+nanospec.cpu.shim"

_register_ops()

__all__ = [
    "IS_NANOSPEC_SHIM",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "decode_attention_cpu",
    "extend_attention_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "tree_speculative_sampling_target_only",
    "verify_tree_greedy_cpu",
]
