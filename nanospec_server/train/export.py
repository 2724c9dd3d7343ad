"""Write a trained head as a directory SGLang loads with --speculative-draft-model-path.

Contents: ``config.json`` (the target's, with ``architectures`` naming SGLang's EAGLE
class and one hidden layer), ``model.safetensors`` (``fc.*`` and ``layers.0.*`` in
bf16), the target's tokenizer files (so the directory is self-contained) and
``nanospec_head.json`` (how it was trained).

The embedding and LM head are left out by default: SGLang 0.5.23's EAGLE worker
replaces the draft's with the target's at start-up (``set_embed_and_head``), so
storing them (272 MB for Qwen2.5's 151936 x 896 table) would be dead weight.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from nanospec_server.train.head import EagleHead
from nanospec_server.train.target import eagle_architecture

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "generation_config.json",
)
WEIGHTS = "model.safetensors"
INFO = "nanospec_head.json"


def draft_config(target_config: dict) -> dict:
    config = dict(target_config)
    config["architectures"] = [eagle_architecture(target_config)]
    config["num_hidden_layers"] = 1
    if isinstance(config.get("layer_types"), list):
        # transformers validates len(layer_types) == num_hidden_layers
        config["layer_types"] = config["layer_types"][:1]
    config.pop("_model_name_or_path", None)
    config["dtype"] = "bfloat16"
    return config


def export_head(
    head: EagleHead,
    target_dir: Path,
    target_config: dict,
    output: Path,
    info: dict,
    embed: torch.Tensor | None = None,
) -> Path:
    """Write the draft directory ``output`` (created; existing files are overwritten)."""
    output.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: value.detach().to("cpu", torch.bfloat16).contiguous()
        for name, value in head.state_dict().items()
    }
    if embed is not None:
        tensors["embed_tokens.weight"] = embed.detach().to("cpu", torch.bfloat16).contiguous()
    config = draft_config(target_config)
    config["intermediate_size"] = head.cfg.intermediate_size  # a head may be narrower
    return write_draft_dir(output, tensors, config, target_dir, info)


def write_draft_dir(
    output: Path, tensors: dict[str, torch.Tensor], config: dict, target_dir: Path, info: dict
) -> Path:
    """The files of a draft directory (EAGLE-1 or EAGLE-3): weights, config, the target's
    tokenizer files and our run info, readable by all."""
    save_file(tensors, str(output / WEIGHTS), metadata={"format": "pt"})
    (output / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name in TOKENIZER_FILES:
        if (target_dir / name).is_file():
            shutil.copyfile(target_dir / name, output / name)
    (output / INFO).write_text(json.dumps(info, indent=2, sort_keys=True, default=str) + "\n")
    for path in output.iterdir():
        if path.is_file():  # safetensors writes owner-only files; a server may run as another user
            path.chmod(0o644)
    return output
