"""The EAGLE-3 draft head, as SGLang 0.5.23's ``LlamaForCausalLMEagle3`` computes it (also
for Qwen targets), so weights trained here serve unchanged.

Per position i, with e(x) the target's (frozen, shared) embedding and a_i the target's
auxiliary hidden states at i (low, middle, high layers, concatenated):

    g   = fc(a_i)                                            # step 0; later steps: g = r2
    x   = cat(input_layernorm(e(t_{i+1})), hidden_norm(g))   # width 2H
    r1  = g + o_proj(attention(x))
    r2  = r1 + mlp(post_attention_layernorm(r1))
    logits = lm_head(norm(r2))                               # over the draft vocabulary D

A draft step after the first feeds ``r2`` (pre-norm) of the previous step as ``g``: SGLang
returns it as the draft's aux state and skips ``fc`` when the width is already H.
Parameter names are SpecForge's (``midlayer.*``), which SGLang's loader renames.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from nanospec_server.train.head import (
    MLP,
    Attention,
    HeadConfig,
    RMSNorm,
    rope_cos_sin,
)


@dataclass(frozen=True)
class Eagle3Config:
    layer: HeadConfig  # sizes of the decoder layer (qkv_bias is ignored: EAGLE-3 has none)
    num_aux: int  # target layers fused by fc
    draft_vocab_size: int  # rows of the head's own LM head


class Eagle3Attention(Attention):
    """Attention over [embedding, hidden] (2H wide); no q/k/v bias, as SGLang builds it."""

    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__(cfg, in_features=2 * cfg.hidden_size, qkv_bias=False)


class MidLayer(nn.Module):
    def __init__(self, cfg: HeadConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def attention_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)

    def finish(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The residual stream after the layer (``r2``): the next step's hidden input."""
        r1 = hidden + attended
        return r1 + self.mlp(self.post_attention_layernorm(r1))


def step_mask(length: int, step: int, device) -> torch.Tensor:
    """What a query at position i of unrolled step ``step`` attends to, [L, (step+1) L]:
    step 0's keys at positions <= i - step (key 0 at least, so a row with no valid start
    still attends to something), then each later step s's key at position i - step + s
    (the draft's own earlier guesses, one per step). This is SGLang's draft KV cache when
    drafting step ``step`` of a draft started at i - step."""
    query = torch.arange(length, device=device)[:, None]
    key = torch.arange(length, device=device)[None, :]
    blocks = [key <= (query - step).clamp(min=0)]
    blocks += [key == query - step + s for s in range(1, step + 1)]
    return torch.cat(blocks, dim=1)


class Eagle3Head(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.cfg = cfg
        hidden = cfg.layer.hidden_size
        self.fc = nn.Linear(cfg.num_aux * hidden, hidden, bias=False)
        self.midlayer = MidLayer(cfg.layer)
        self.norm = RMSNorm(hidden, cfg.layer.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, cfg.draft_vocab_size, bias=False)

    def reset_parameters(self, generator: torch.Generator, std: float = 0.02) -> None:
        """Seeded init: normal(std) matrices, unit norms (the LM head is set by the caller)."""
        for name, param in self.named_parameters():
            with torch.no_grad():
                if name.endswith("norm.weight"):
                    param.fill_(1.0)
                else:
                    param.copy_(torch.randn(param.shape, generator=generator) * std)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits of the residual stream ``r2``."""
        return self.lm_head(self.norm(hidden))

    def unroll(
        self, next_embeds: torch.Tensor, aux: torch.Tensor, positions: torch.Tensor, steps: int
    ) -> list[torch.Tensor]:
        """Training-time test: ``steps`` draft steps from every position at once.

        next_embeds [B, L, H]: e(t_{i+1}); aux [B, L, num_aux*H]: the fused target states
        at i. Step j at position i is the j-th step of a draft started at i - j: it is fed
        t_{i+1} and step j-1's ``r2`` at position i-1, and attends to ``step_mask``.
        Returns each step's ``r2`` [B, L, H]; positions i < j have no start (garbage).
        """
        cfg = self.cfg.layer
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
        layer, length = self.midlayer, aux.shape[1]
        first = self.fc(aux)
        hidden = first
        keys, values, outputs = [], [], []
        for step in range(steps):
            x = layer.attention_input(next_embeds, hidden)
            q, k, v = layer.self_attn.project(x, cos, sin)
            keys.append(k)
            values.append(v)
            mask = step_mask(length, step, aux.device)
            attended = layer.self_attn.attend(q, torch.cat(keys, 2), torch.cat(values, 2), mask)
            out = layer.finish(hidden, attended)
            outputs.append(out)
            # the next step's hidden at position i is this step's r2 from position i - 1
            hidden = torch.cat([first[:, :1], out[:, :-1]], dim=1)
        return outputs
