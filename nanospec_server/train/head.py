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
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from nanospec_server.train.target import find_tensor


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
    def __init__(
        self, cfg: HeadConfig, in_features: int | None = None, qkv_bias: bool | None = None
    ) -> None:
        """``in_features`` (default the hidden size) and ``qkv_bias`` (default the config's)
        differ for EAGLE-3, whose layer attends over [embedding, hidden] without biases."""
        super().__init__()
        self.cfg = cfg
        width = cfg.hidden_size if in_features is None else in_features
        bias = cfg.qkv_bias if qkv_bias is None else qkv_bias
        q_out, kv_out = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.q_proj = nn.Linear(width, q_out, bias=bias)
        self.k_proj = nn.Linear(width, kv_out, bias=bias)
        self.v_proj = nn.Linear(width, kv_out, bias=bias)
        self.o_proj = nn.Linear(q_out, cfg.hidden_size, bias=False)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v as [B, heads, L, head_dim], RoPE applied."""
        batch, length, _ = x.shape
        cfg = self.cfg

        def heads(proj: nn.Linear, count: int) -> torch.Tensor:
            return proj(x).view(batch, length, count, cfg.head_dim).transpose(1, 2)

        q = apply_rope(heads(self.q_proj, cfg.num_heads), cos, sin)
        k = apply_rope(heads(self.k_proj, cfg.num_kv_heads), cos, sin)
        return q, k, heads(self.v_proj, cfg.num_kv_heads)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``mask`` [L_q, L_k] bool (True: attend); None: causal over equal lengths."""
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True
        )
        batch, _, length, _ = q.shape
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.attend(*self.project(x, cos, sin), mask=None)


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
        return self.finish(x, self.self_attn(x, cos, sin))

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        h = x + attended
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

    def unroll(
        self, next_embeds: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
        steps: int,
    ) -> list[torch.Tensor]:  # fmt: skip
        """Training-time test (EAGLE-3, HASS): the head drafting ``steps`` tokens in a row
        from every position at once, as SGLang drafts them.

        Step 0 is teacher forcing (``forward``). At step j, position i drafts from the
        token t_{i+1} and the feature step j-1 predicted at position i-1, and attends to
        what the draft's KV cache holds at that point of a real draft: the target's
        features up to position i-j (step 0's keys) and its own j earlier guesses, one
        per step on the diagonal (step s's key at position i-j+s). Returns each step's
        predictions [B, L, d]; step j at position i predicts f_{i+1} from a draft that
        started at i-j. Positions i < j have no such start: their values are garbage.
        """
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta)
        (layer,) = self.layers
        length = features.shape[1]
        query = torch.arange(length, device=features.device)[:, None]
        key = torch.arange(length, device=features.device)[None, :]
        keys, values, outputs = [], [], []
        guess = features
        for step in range(steps):
            x = self.fc(torch.cat([next_embeds, guess], dim=-1))
            q, k, v = layer.self_attn.project(x, cos, sin)
            keys.append(k)
            values.append(v)
            # step 0's keys: the target's features at positions <= i - step (key 0 at
            # least, so a row with no valid start still has something to attend to)
            blocks = [key <= (query - step).clamp(min=0)]
            blocks += [key == query - step + s for s in range(1, step + 1)]
            mask = torch.cat(blocks, dim=1)
            attended = layer.self_attn.attend(q, torch.cat(keys, 2), torch.cat(values, 2), mask)
            out = layer.finish(x, attended)
            outputs.append(out)
            # the next step's feature at position i is this step's guess from i - 1
            guess = torch.cat([features[:, :1], out[:, :-1]], dim=1)
        return outputs


def init_from_last_layer(head: EagleHead, target_dir, layer: int) -> None:
    """Copy the target's decoder layer ``layer`` into the head's (fc stays random).

    The head's layer maps the target's last states to the next ones, much as the target's
    last layer does, so this starts nearer a solution than noise. A narrower MLP takes
    the first ``intermediate_size`` channels.
    """
    with torch.no_grad():
        for name, param in head.layers[0].named_parameters():
            source = find_tensor(target_dir, [f"model.layers.{layer}.{name}"])
            param.copy_(source[tuple(slice(0, size) for size in param.shape)].to(param.dtype))


def load_head(head: EagleHead, head_dir: Path) -> None:
    """The weights of an exported head (``export.py``); the shapes must match."""
    # deferred: imports safetensors only when called
    from safetensors.torch import load_file

    weights = load_file(str(head_dir / "model.safetensors"))
    weights.pop("embed_tokens.weight", None)  # SGLang's copy of the target's, not trained
    head.load_state_dict({name: value.float() for name, value in weights.items()})
