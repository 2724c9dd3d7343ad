"""Seeded, deterministic weights for the tiny test models.

Tensors use HF checkpoint names: ``model.*`` / ``lm_head.weight`` for a
``LlamaForCausalLM``, and the EAGLE-1 layout (``embed_tokens.weight``,
``fc.weight``, ``fc.bias``, ``layers.0.*`` with no ``input_layernorm``) for an
EAGLE draft, which is what SGLang's ``LlamaForCausalLMEagle.load_weights``
expects (it prefixes ``model.`` itself and ignores any ``lm_head``). An EAGLE-3 draft
uses SpecForge's names (``midlayer.*``, ``fc``, ``norm``, its own ``lm_head`` and, when its
vocabulary is pruned, ``d2t``/``t2d``), which ``LlamaForCausalLMEagle3.load_weights`` reads.

How the ``agree-*`` models agree
--------------------------------
``agree-target`` has every ``o_proj`` zeroed, so attention adds nothing and
each position's output depends only on its own token: the greedy successor is
a fixed map ``next(t)``. Its ``lm_head`` is built so that ``next`` is one long
cycle over all regular tokens (special tokens map into the cycle and are never
predicted). Row ``next(r)`` of the head is the unit vector of the target's own
final hidden state for ``r``, so the target's top logit is a cosine of 1 while
the rest are cosines between nearly random directions.

Because the target is context-free, a draft that sees the prompt shifted by
one position still only has to reproduce ``next(current token)``.
``agree-eagle`` has ``fc = [I | 0]`` (it ignores the target feature), zeroed
``o_proj``, and the target's layer-0 MLP: its output is exactly the target's
residual stream after layer 0. ``agree-standalone`` is the target's embedding,
layer 0, final norm and head. Both differ from the target's final hidden state
only by the (scaled-down) contribution of its layer 1, far less than the
logit margin; ``check_agreement`` asserts this for every token id at build.
"""

from __future__ import annotations

from functools import cache

import torch

from nanospec_server.models.tiny.reference import (
    Tensors,
    eagle_logits,
    llama_hidden,
    llama_logits,
)
from nanospec_server.models.tiny.spec import (
    DRAFT_SHAPE,
    EAGLE3_AUX_LAYER_IDS,
    TARGET_SHAPE,
    TINY_MODELS,
    LlamaShape,
)
from nanospec_server.models.tiny.tokenizer import EOS_ID, SPECIAL_TOKENS

DTYPE = torch.bfloat16

SEEDS = {
    "tiny-target": 1001,
    "tiny-eagle": 1002,
    "tiny-standalone": 1003,
    "tiny-eagle3": 1004,
    "tiny-eagle3-full": 1005,
    "wide-target": 1006,
    "agree-target": 2001,
}

# Gives the random models logits with a std of about 2, so greedy choices are
# decisive rather than near-ties that bf16 rounding could flip between paths.
LM_HEAD_GAIN = 2.0
# Shrinks agree-target's MLP outputs so that the drafts, which only copy its
# layer 0, stay well inside the logit margin.
AGREE_MLP_GAIN = 0.25
# Scale of agree-target's logits: top logit ~ AGREE_LOGIT_SCALE * sqrt(hidden).
AGREE_LOGIT_SCALE = 2.0
# Minimum top-1 minus top-2 logit gap the agreeing models must keep (fp32).
MIN_AGREE_MARGIN = 2.0

NUM_SPECIAL = len(SPECIAL_TOKENS)


def _normal(gen: torch.Generator, rows: int, cols: int, std: float) -> torch.Tensor:
    return torch.randn(rows, cols, generator=gen, dtype=torch.float32) * std


def _layer_tensors(
    gen: torch.Generator, shape: LlamaShape, prefix: str, input_norm: bool
) -> Tensors:
    """One random decoder layer; projections have std 1/sqrt(fan_in)."""
    hidden, inter = shape.hidden_size, shape.intermediate_size
    q_out = shape.num_heads * shape.head_dim
    kv_out = shape.num_kv_heads * shape.head_dim
    tensors = {
        f"{prefix}self_attn.q_proj.weight": _normal(gen, q_out, hidden, hidden**-0.5),
        f"{prefix}self_attn.k_proj.weight": _normal(gen, kv_out, hidden, hidden**-0.5),
        f"{prefix}self_attn.v_proj.weight": _normal(gen, kv_out, hidden, hidden**-0.5),
        f"{prefix}self_attn.o_proj.weight": _normal(gen, hidden, q_out, q_out**-0.5),
        f"{prefix}mlp.gate_proj.weight": _normal(gen, inter, hidden, hidden**-0.5),
        f"{prefix}mlp.up_proj.weight": _normal(gen, inter, hidden, hidden**-0.5),
        f"{prefix}mlp.down_proj.weight": _normal(gen, hidden, inter, inter**-0.5),
        f"{prefix}post_attention_layernorm.weight": torch.ones(hidden),
    }
    if input_norm:
        tensors[f"{prefix}input_layernorm.weight"] = torch.ones(hidden)
    return tensors


def _round(tensors: Tensors) -> Tensors:
    """Round to the checkpoint dtype (contiguous: safetensors needs it)."""
    return {name: t.to(DTYPE).contiguous() for name, t in tensors.items()}


def random_llama(shape: LlamaShape, seed: int) -> Tensors:
    """A random-init ``LlamaForCausalLM`` with an untied lm_head."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {"model.embed_tokens.weight": _normal(gen, shape.vocab_size, shape.hidden_size, 1.0)}
    for layer in range(shape.num_layers):
        tensors |= _layer_tensors(gen, shape, f"model.layers.{layer}.", input_norm=True)
    tensors["model.norm.weight"] = torch.ones(shape.hidden_size)
    tensors["lm_head.weight"] = _normal(
        gen, shape.vocab_size, shape.hidden_size, LM_HEAD_GAIN * shape.hidden_size**-0.5
    )
    return _round(tensors)


def random_eagle(shape: LlamaShape, seed: int, target: Tensors) -> Tensors:
    """A random-init EAGLE draft; its embedding is a copy of the target's."""
    gen = torch.Generator().manual_seed(seed)
    hidden = shape.hidden_size
    tensors = {
        "embed_tokens.weight": target["model.embed_tokens.weight"].clone(),
        "fc.weight": _normal(gen, hidden, 2 * hidden, (2 * hidden) ** -0.5),
        # SGLang's fc has a bias; leaving it out of the file would leave it at
        # torch's random init, i.e. non-deterministic drafts.
        "fc.bias": _normal(gen, 1, hidden, 0.02).view(hidden),
    }
    for layer in range(shape.num_layers):
        tensors |= _layer_tensors(gen, shape, f"layers.{layer}.", input_norm=layer > 0)
    return _round(tensors)


def draft_vocabulary(vocab_size: int, size: int, seed: int) -> torch.Tensor:
    """A pruned head's vocabulary D: ``size`` token ids, ascending as SpecForge sorts them,
    EOS always among them (every training answer ends with it)."""
    gen = torch.Generator().manual_seed(seed)
    others = torch.tensor([t for t in range(vocab_size) if t != EOS_ID])
    chosen = others[torch.randperm(len(others), generator=gen)[: size - 1]]
    return torch.cat([chosen, torch.tensor([EOS_ID])]).sort().values


def random_eagle3(shape: LlamaShape, seed: int, draft_vocab_size: int) -> Tensors:
    """A random-init EAGLE-3 draft in SpecForge's layout. Below the target's vocabulary
    size its head covers D = ``draft_vocabulary(...)`` only, and ``d2t[i] = D[i] - i``
    (what SGLang adds to ``arange``) and the boolean ``t2d`` (which it drops) describe D."""
    gen = torch.Generator().manual_seed(seed)
    hidden, aux = shape.hidden_size, len(EAGLE3_AUX_LAYER_IDS)
    tensors = {"fc.weight": _normal(gen, hidden, aux * hidden, (aux * hidden) ** -0.5)}
    layer = _layer_tensors(gen, shape, "midlayer.", input_norm=True)
    # Layer 0 attends over [embedding, feature]: twice the input width.
    q_out, kv_out = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    for name, rows in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
        layer[f"midlayer.self_attn.{name}.weight"] = _normal(
            gen, rows, 2 * hidden, (2 * hidden) ** -0.5
        )
    tensors |= layer | {
        "midlayer.hidden_norm.weight": torch.ones(hidden),
        "norm.weight": torch.ones(hidden),
    }
    tensors["lm_head.weight"] = _normal(gen, draft_vocab_size, hidden, LM_HEAD_GAIN * hidden**-0.5)
    tensors = _round(tensors)
    if draft_vocab_size < shape.vocab_size:
        ids = draft_vocabulary(shape.vocab_size, draft_vocab_size, seed)
        tensors["d2t"] = ids - torch.arange(draft_vocab_size)
        t2d = torch.zeros(shape.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        tensors["t2d"] = t2d
    return tensors


def agree_successor(vocab_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy successor map of agree-target and each token's regular twin.

    Regular tokens form a single cycle in a seeded random order. A special
    token ``s`` gets a regular twin ``r`` (``twin[s] = r``, ``twin[r] = r``)
    whose embedding it shares, so ``next(s) = next(r)`` is regular too.
    """
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(vocab_size - NUM_SPECIAL, generator=gen) + NUM_SPECIAL
    successor = torch.empty(vocab_size, dtype=torch.long)
    successor[order] = order.roll(-1)
    twin = torch.arange(vocab_size)
    twin[:NUM_SPECIAL] = torch.randint(NUM_SPECIAL, vocab_size, (NUM_SPECIAL,), generator=gen)
    successor[:NUM_SPECIAL] = successor[twin[:NUM_SPECIAL]]
    return successor, twin


def agree_target(shape: LlamaShape, seed: int) -> Tensors:
    """The context-free target whose greedy successor map is ``agree_successor``."""
    successor, twin = agree_successor(shape.vocab_size, seed)
    tensors = {k: v.float() for k, v in random_llama(shape, seed).items()}
    embed = tensors["model.embed_tokens.weight"]
    tensors["model.embed_tokens.weight"] = embed[twin].clone()
    for layer in range(shape.num_layers):
        prefix = f"model.layers.{layer}."
        # The one change that makes the model context-free.
        tensors[f"{prefix}self_attn.o_proj.weight"].zero_()
        tensors[f"{prefix}mlp.down_proj.weight"] *= AGREE_MLP_GAIN
    tensors = _round(tensors)

    # Head rows from the rounded weights' own hidden states, so the bf16 model
    # (not an fp32 ideal of it) has cosine 1 for the intended successor.
    regular = torch.arange(NUM_SPECIAL, shape.vocab_size)
    fp32 = {k: v.float() for k, v in tensors.items()}
    hidden = llama_hidden(fp32, shape, regular)
    head = torch.zeros(shape.vocab_size, shape.hidden_size)
    # Special rows stay zero: a logit of 0 never beats the top logit of ~+16.
    head[successor[regular]] = AGREE_LOGIT_SCALE * hidden / hidden.norm(dim=-1, keepdim=True)
    tensors["lm_head.weight"] = head.to(DTYPE).contiguous()
    return tensors


def agree_eagle(shape: LlamaShape, target: Tensors) -> Tensors:
    """EAGLE draft that ignores its feature input and copies target layer 0."""
    hidden = shape.hidden_size
    fc = torch.zeros(hidden, 2 * hidden)
    fc[:, :hidden] = torch.eye(hidden)  # embedding half: identity; feature half: 0
    tensors = {
        "embed_tokens.weight": target["model.embed_tokens.weight"].clone(),
        "fc.weight": fc,
        "fc.bias": torch.zeros(hidden),
    }
    for name, value in target.items():
        # Layer 0 without input_layernorm: SGLang's EAGLE layer 0 has none, and
        # the target's is all ones, so skipping it only rescales the attention
        # input, whose output o_proj zeroes anyway.
        if name.startswith("model.layers.0.") and "input_layernorm" not in name:
            tensors[name.removeprefix("model.")] = value.clone()
    return _round(tensors)


def agree_standalone(target: Tensors) -> Tensors:
    """Standalone draft: agree-target truncated to its first layer."""
    return {
        name: value.clone()
        for name, value in target.items()
        if not name.startswith("model.layers.") or name.startswith("model.layers.0.")
    }


def _greedy_with_margin(logits: torch.Tensor) -> tuple[torch.Tensor, float]:
    top2 = logits.topk(2, dim=-1).values
    return logits.argmax(dim=-1), float((top2[:, 0] - top2[:, 1]).min())


def check_agreement(target: Tensors, eagle: Tensors, standalone: Tensors, seed: int) -> None:
    """Assert both drafts' greedy successor equals the target's for every token id."""
    vocab = TARGET_SHAPE.vocab_size
    ids = torch.arange(vocab)
    successor, _ = agree_successor(vocab, seed)
    fp32 = {k: v.float() for k, v in target.items()}
    # Any feature: the draft must ignore what the target hands over.
    features = torch.randn(
        vocab, TARGET_SHAPE.hidden_size, generator=torch.Generator().manual_seed(0)
    )
    results = {
        "agree-target": llama_logits(fp32, TARGET_SHAPE, ids),
        "agree-eagle": eagle_logits(
            {k: v.float() for k, v in eagle.items()},
            DRAFT_SHAPE,
            fp32["lm_head.weight"],
            ids,
            features,
        ),
        "agree-standalone": llama_logits(
            {k: v.float() for k, v in standalone.items()}, DRAFT_SHAPE, ids
        ),
    }
    for name, logits in results.items():
        greedy, margin = _greedy_with_margin(logits)
        mismatches = int((greedy != successor).sum())
        if mismatches or margin < MIN_AGREE_MARGIN:
            raise AssertionError(f"{name}: {mismatches} mismatches, min logit margin {margin:.3f}")


@cache
def model_tensors(name: str) -> Tensors:
    """The checkpoint tensors of tiny model ``name`` (cached; do not mutate)."""
    spec = TINY_MODELS[name]
    if name in ("tiny-target", "wide-target"):
        return random_llama(spec.shape, SEEDS[name])
    if name == "tiny-eagle":
        return random_eagle(spec.shape, SEEDS[name], model_tensors("tiny-target"))
    if name == "tiny-standalone":
        return random_llama(spec.shape, SEEDS[name])
    if name in ("tiny-eagle3", "tiny-eagle3-full"):
        return random_eagle3(spec.shape, SEEDS[name], spec.draft_vocab_size)
    if name == "agree-target":
        return agree_target(spec.shape, SEEDS[name])
    if name in ("agree-eagle", "agree-standalone"):
        target = model_tensors("agree-target")
        eagle = agree_eagle(DRAFT_SHAPE, target)
        standalone = agree_standalone(target)
        check_agreement(target, eagle, standalone, SEEDS["agree-target"])
        return eagle if name == "agree-eagle" else standalone
    raise KeyError(name)
