"""Plain-torch forward passes of the tiny models on one-token sequences.

Each token id is run as its own sequence of length one (position 0). There the
softmax attends to a single key, so attention reduces to ``o_proj(v)`` and
RoPE drops out. For the context-free ``agree-*`` models (o_proj zeroed) this
one-token output is the output at any position in any context, which makes it
the successor map that the agreement checks compare.

The EAGLE draft mirrors what SGLang's ``LlamaForCausalLMEagle`` computes:

    h = fc(concat(embed(token), feature))      # feature: the target's hidden
    h = h + o_proj(attn(h))                    # layer 0: no input_layernorm
    h = h + mlp(post_attention_layernorm(h))
    logits = lm_head(h)                        # target's lm_head, no final norm
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from nanospec_server.models.tiny.spec import RMS_NORM_EPS, LlamaShape

Tensors = dict[str, torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Llama RMSNorm: statistics in float32, result in the input's dtype."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + RMS_NORM_EPS)
    return weight * normed.to(x.dtype)


def _linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x @ weight.t()


def single_token_layer(
    x: torch.Tensor, tensors: Tensors, prefix: str, shape: LlamaShape, input_norm: bool = True
) -> torch.Tensor:
    """One decoder layer on rows of ``x`` [N, hidden], each a one-token sequence."""
    attn_in = rms_norm(x, tensors[f"{prefix}input_layernorm.weight"]) if input_norm else x
    v = _linear(attn_in, tensors[f"{prefix}self_attn.v_proj.weight"])
    # One key: softmax weight 1, so each query head reads its KV group's value.
    group = shape.num_heads // shape.num_kv_heads
    v_per_head = v.view(-1, shape.num_kv_heads, shape.head_dim).repeat_interleave(group, dim=1)
    x = x + _linear(v_per_head.reshape(x.shape[0], -1), tensors[f"{prefix}self_attn.o_proj.weight"])
    mlp_in = rms_norm(x, tensors[f"{prefix}post_attention_layernorm.weight"])
    gate = _linear(mlp_in, tensors[f"{prefix}mlp.gate_proj.weight"])
    up = _linear(mlp_in, tensors[f"{prefix}mlp.up_proj.weight"])
    return x + _linear(F.silu(gate) * up, tensors[f"{prefix}mlp.down_proj.weight"])


def llama_hidden(tensors: Tensors, shape: LlamaShape, token_ids: torch.Tensor) -> torch.Tensor:
    """Final-normed hidden state of a ``LlamaForCausalLM`` (HF names), one token each."""
    x = tensors["model.embed_tokens.weight"][token_ids]
    for layer in range(shape.num_layers):
        x = single_token_layer(x, tensors, f"model.layers.{layer}.", shape)
    return rms_norm(x, tensors["model.norm.weight"])


def llama_logits(tensors: Tensors, shape: LlamaShape, token_ids: torch.Tensor) -> torch.Tensor:
    """Logits of a ``LlamaForCausalLM`` for one-token sequences."""
    return _linear(llama_hidden(tensors, shape, token_ids), tensors["lm_head.weight"])


def eagle_logits(
    draft: Tensors,
    shape: LlamaShape,
    target_lm_head: torch.Tensor,
    token_ids: torch.Tensor,
    features: torch.Tensor,
) -> torch.Tensor:
    """Logits of an EAGLE draft (EAGLE checkpoint names) for one-token sequences.

    ``features`` [N, hidden] is what SGLang feeds as ``spec_info.hidden_states``:
    the target's hidden state at the previous position (or the draft's own
    output during multi-step drafting). The embedding is the draft's copy, which
    equals the target's one SGLang substitutes via ``set_embed_and_head``.
    """
    embedded = draft["embed_tokens.weight"][token_ids]
    x = _linear(torch.cat((embedded, features), dim=-1), draft["fc.weight"]) + draft["fc.bias"]
    for layer in range(shape.num_layers):
        # Only layer 0 lacks input_layernorm (EAGLE feeds fc's output in raw).
        x = single_token_layer(x, draft, f"layers.{layer}.", shape, input_norm=layer > 0)
    return _linear(x, target_lm_head)
