"""The EAGLE-1 draft head, as SGLang 0.5.23's ``Qwen2ForCausalLMEagle`` /
``LlamaForCausalLMEagle`` computes it, so weights trained here serve unchanged.

Per position i, with e(x) the target's (frozen, shared) embedding and f_i the
target's final-normed hidden state at i:

    x   = fc(concat(e(token_{i+1}), f_i))          # embedding first, then feature
    h   = x + o_proj(attention(x))                 # layer 0 has NO input_layernorm
    out = h + mlp(post_attention_layernorm(h))     # and the draft has NO final norm

``out`` approximates f_{i+1}; the target's LM head on it gives the draft token.
The parameter names equal the checkpoint names SGLang's ``load_weights`` reads
(it prefixes ``model.`` and fuses q/k/v and gate/up itself).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    qkv_bias: bool

    @classmethod
    def from_target(cls, config: dict) -> HeadConfig:
        rope = config.get("rope_parameters") or {}
        rope_type = rope.get("rope_type", "default")
        if rope_type != "default" or config.get("rope_scaling"):
            raise NotImplementedError(f"RoPE type {rope_type!r}: only plain RoPE is supported")
        heads = config["num_attention_heads"]
        return cls(
            hidden_size=config["hidden_size"],
            intermediate_size=config["intermediate_size"],
            num_heads=heads,
            num_kv_heads=config.get("num_key_value_heads", heads),
            head_dim=config.get("head_dim") or config["hidden_size"] // heads,
            rms_norm_eps=config["rms_norm_eps"],
            rope_theta=rope.get("rope_theta", config.get("rope_theta", 10000.0)),
            # Qwen2 always has q/k/v biases; Llama has them when attention_bias is set.
            qkv_bias=config["model_type"] == "qwen2" or bool(config.get("attention_bias")),
        )


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * normed).to(x.dtype)


def rope_cos_sin(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = theta ** -(torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    angles = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)  # neox layout: halves, not interleaved
    return angles.cos(), angles.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos.to(x.dtype) + _rotate_half(x) * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        q_out, kv_out = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, q_out, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_out, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_out, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(q_out, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        cfg = self.cfg

        def heads(proj: nn.Linear, count: int) -> torch.Tensor:
            return proj(x).view(batch, length, count, cfg.head_dim).transpose(1, 2)

        q = apply_rope(heads(self.q_proj, cfg.num_heads), cos, sin)
        k = apply_rope(heads(self.k_proj, cfg.num_kv_heads), cos, sin)
        v = heads(self.v_proj, cfg.num_kv_heads)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Decoder layer 0 of an EAGLE draft: no input_layernorm."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.self_attn(x, cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class EagleHead(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=True)
        self.layers = nn.ModuleList([DecoderLayer(cfg)])

    def reset_parameters(self, generator: torch.Generator, std: float = 0.02) -> None:
        """Seeded init: normal(std) matrices, zero biases, unit norms."""
        for name, param in self.named_parameters():
            with torch.no_grad():
                if name.endswith("layernorm.weight"):
                    param.fill_(1.0)
                elif name.endswith("bias"):
                    param.zero_()
                else:
                    param.copy_(torch.randn(param.shape, generator=generator) * std)

    def forward(
        self, next_embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """next_embeds, features: [B, L, d]; positions: [L]. Returns predicted features."""
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta)
        x = self.fc(torch.cat([next_embeds, features], dim=-1))
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x
