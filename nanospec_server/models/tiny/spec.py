"""Names, shapes and ``config.json`` contents of the tiny test models.

The weights themselves are made in ``weights.py``; ``build.py`` writes both.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from nanospec_server.models.tiny.tokenizer import BOS_ID, EOS_ID, MAX_LENGTH, PAD_ID, VOCAB_SIZE


class ModelKind(str, Enum):
    """How SGLang uses a model: as the target, an EAGLE draft or a standalone draft."""

    TARGET = "target"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    STANDALONE = "standalone"


@dataclass(frozen=True)
class LlamaShape:
    """The shape of a tiny Llama; head_dim = hidden_size // num_heads = 16."""

    num_layers: int
    hidden_size: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 128
    vocab_size: int = VOCAB_SIZE

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class TinyModelSpec:
    """One tiny model: its name, role, shape and, for a draft, its target."""

    name: str
    kind: ModelKind
    shape: LlamaShape
    description: str
    target: str | None = None
    # EAGLE-3 only: rows of the draft's own LM head (its d2t vocabulary D, or every token).
    draft_vocab_size: int | None = None


TARGET_SHAPE = LlamaShape(num_layers=2)
DRAFT_SHAPE = LlamaShape(num_layers=1)
# As wide as a 1.5B model's layers: there a bf16 F.linear rounds a row differently with
# other rows beside it, which 64-wide layers never show.
WIDE_SHAPE = LlamaShape(num_layers=1, hidden_size=1536, num_heads=96, intermediate_size=4096)
# The pruned EAGLE-3 head's vocabulary D: a bit over half the target's tokens, so that
# many window tokens fall outside it.
PRUNED_DRAFT_VOCAB = 512
# Target layers whose outputs an EAGLE-3 head reads (SGLang adds one to each id; -1 is the
# embedding). SGLang's default [2, L/2, L-3] does not fit the 2-layer tiny target.
EAGLE3_AUX_LAYER_IDS = [-1, 0]

TINY_MODELS: dict[str, TinyModelSpec] = {
    spec.name: spec
    for spec in (
        TinyModelSpec(
            "tiny-target",
            ModelKind.TARGET,
            TARGET_SHAPE,
            "Random-init 2-layer Llama target: exercises the whole serving path.",
        ),
        TinyModelSpec(
            "tiny-eagle",
            ModelKind.EAGLE,
            DRAFT_SHAPE,
            "Random-init 1-layer EAGLE draft for tiny-target: loads and runs, drafts are almost never accepted.",
            target="tiny-target",
        ),
        TinyModelSpec(
            "tiny-standalone",
            ModelKind.STANDALONE,
            DRAFT_SHAPE,
            "Random-init 1-layer standalone Llama draft for tiny-target.",
            target="tiny-target",
        ),
        TinyModelSpec(
            "tiny-eagle3",
            ModelKind.EAGLE3,
            DRAFT_SHAPE,
            "Random-init 1-layer EAGLE-3 draft (LlamaForCausalLMEagle3) for tiny-target "
            f"with a pruned vocabulary: {PRUNED_DRAFT_VOCAB} LM-head rows and a d2t map.",
            target="tiny-target",
            draft_vocab_size=PRUNED_DRAFT_VOCAB,
        ),
        TinyModelSpec(
            "tiny-eagle3-full",
            ModelKind.EAGLE3,
            DRAFT_SHAPE,
            "Random-init 1-layer EAGLE-3 draft for tiny-target with a full-vocabulary LM "
            "head of its own and no d2t.",
            target="tiny-target",
            draft_vocab_size=VOCAB_SIZE,
        ),
        TinyModelSpec(
            "wide-target",
            ModelKind.TARGET,
            WIDE_SHAPE,
            "Random-init 1-layer Llama target with a 1.5B model's widths (hidden 1536, MLP "
            "4096) and tiny-target's vocabulary: its drafts are STANDALONE ones.",
        ),
        TinyModelSpec(
            "agree-target",
            ModelKind.TARGET,
            TARGET_SHAPE,
            "Context-free 2-layer Llama target (o_proj zeroed): its greedy next token "
            "depends only on the current token and walks one long cycle through all "
            "regular tokens, never emitting a special token.",
        ),
        TinyModelSpec(
            "agree-eagle",
            ModelKind.EAGLE,
            DRAFT_SHAPE,
            "EAGLE draft whose greedy prediction equals agree-target's for every token: "
            "greedy acceptance length is num_steps + 1.",
            target="agree-target",
        ),
        TinyModelSpec(
            "agree-standalone",
            ModelKind.STANDALONE,
            DRAFT_SHAPE,
            "Standalone draft whose greedy prediction equals agree-target's for every token.",
            target="agree-target",
        ),
    )
}

ROPE_THETA = 10000.0
RMS_NORM_EPS = 1e-6
DTYPE_NAME = "bfloat16"


def config_dict(spec: TinyModelSpec) -> dict[str, object]:
    """The HF ``config.json`` for ``spec`` (model_type llama)."""
    shape = spec.shape
    architecture = {
        ModelKind.EAGLE: "LlamaForCausalLMEagle",
        ModelKind.EAGLE3: "LlamaForCausalLMEagle3",
    }.get(spec.kind, "LlamaForCausalLM")
    config: dict[str, object] = {
        # SGLang picks the model class from architectures[0]; for an EAGLE draft
        # it must name the EAGLE class, as it does not rename plain Llama drafts.
        "architectures": [architecture],
        "model_type": "llama",
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_LENGTH,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
        "dtype": DTYPE_NAME,
    }
    if spec.kind is ModelKind.EAGLE3:
        # SpecForge's layout: the target's hidden size, the draft's own vocabulary size
        # and which target layers feed the head.
        config["target_hidden_size"] = TARGET_SHAPE.hidden_size
        config["draft_vocab_size"] = spec.draft_vocab_size
        config["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": EAGLE3_AUX_LAYER_IDS,
            "use_aux_hidden_state": True,
        }
    return config
