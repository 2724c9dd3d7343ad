"""Write a trained EAGLE-3 head as SpecForge writes one, for SGLang's stock
``LlamaForCausalLMEagle3`` (``--speculative-algorithm EAGLE3``), also for Qwen targets.

``config.json``: a one-layer Llama config with the target's sizes, ``draft_vocab_size``,
``target_hidden_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids`` (the layers the
head was trained on; SGLang adds one to each). ``model.safetensors``: ``fc.weight``,
``midlayer.*``, ``norm.weight`` and, for a pruned vocabulary, ``lm_head.weight`` over D with
``d2t``/``t2d`` (``eagle3_vocab.py``).

With ``shared_lm_head`` the head drafts over the whole vocabulary through the target's own
LM head: ``draft_vocab_size`` is null, which makes SGLang 0.5.23 set
``load_lm_head_from_target`` and hand the draft the target's head at start-up, so no LM
head is stored (what keeps a 1.5B head small). ``tie_word_embeddings`` is false either
way: true would make the draft's LM head its embedding table.
"""

from __future__ import annotations

from pathlib import Path

import torch

from nanospec_server.train.eagle3_head import Eagle3Head
from nanospec_server.train.export import write_draft_dir

ARCHITECTURE = "LlamaForCausalLMEagle3"
# Target config keys a Llama draft config carries over unchanged.
CARRIED = (
    "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
    "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_parameters",
    "rope_scaling", "vocab_size", "bos_token_id", "eos_token_id", "pad_token_id",
)  # fmt: skip


def eagle3_config(
    target_config: dict, head: Eagle3Head, aux_layer_ids: list[int], shared_lm_head: bool
) -> dict:
    config = {key: target_config[key] for key in CARRIED if key in target_config}
    layer = head.cfg.layer
    config.update({
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "intermediate_size": layer.intermediate_size,
        "head_dim": layer.head_dim,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "target_hidden_size": target_config["hidden_size"],
        "draft_vocab_size": None if shared_lm_head else head.cfg.draft_vocab_size,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": aux_layer_ids,
            "use_aux_hidden_state": True,
        },
        "dtype": "bfloat16",
    })  # fmt: skip
    config.setdefault("hidden_act", "silu")
    return config


def export_eagle3(
    head: Eagle3Head,
    target_dir: Path,
    target_config: dict,
    output: Path,
    aux_layer_ids: list[int],
    vocab: tuple[torch.Tensor, torch.Tensor] | None,
    info: dict,
) -> Path:
    """``vocab``: (d2t, t2d) of a pruned head; None: the target's LM head is shared."""
    output.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: value.detach().to("cpu", torch.bfloat16).contiguous()
        for name, value in head.state_dict().items()
        if vocab is not None or not name.startswith("lm_head.")
    }
    if vocab is not None:
        d2t, t2d = vocab
        tensors["d2t"], tensors["t2d"] = d2t.long().contiguous(), t2d.bool().contiguous()
    config = eagle3_config(target_config, head, aux_layer_ids, shared_lm_head=vocab is None)
    return write_draft_dir(output, tensors, config, target_dir, info)
