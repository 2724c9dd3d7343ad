"""The target model: resolve a path or registry name, load it frozen, pick the device."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from nanospec_server.models.prepare import prepare_model
from nanospec_server.models.registry import get_model_spec

# Draft architecture SGLang 0.5.23 loads for each target architecture (models/*_eagle.py).
EAGLE_ARCHITECTURES = {
    "Qwen2ForCausalLM": "Qwen2ForCausalLMEagle",
    "LlamaForCausalLM": "LlamaForCausalLMEagle",
}


def pick_device(requested: str = "auto") -> torch.device:
    """``auto``: CUDA when present, else CPU."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def resolve_target(target: str) -> Path:
    """A checkpoint directory, or a registry name prepared (idempotently) into the cache."""
    path = Path(target).expanduser()
    if (path / "config.json").is_file():
        return path
    if path.exists():
        raise ValueError(f"{target}: no config.json in this directory")

    get_model_spec(target)  # raises with the list of valid names
    return prepare_model(target)


def read_config(model_dir: Path) -> dict:
    return json.loads((model_dir / "config.json").read_text(encoding="utf-8"))


def eagle_architecture(config: dict) -> str:
    arch = config["architectures"][0]
    if arch not in EAGLE_ARCHITECTURES:
        raise ValueError(
            f"no EAGLE draft class for {arch}; supported: {sorted(EAGLE_ARCHITECTURES)}"
        )
    return EAGLE_ARCHITECTURES[arch]


@dataclass
class SharedWeights:
    """What the draft shares with the target at serve time (SGLang swaps them in)."""

    embed: torch.Tensor  # [vocab, hidden]
    lm_head: torch.Tensor  # [vocab, hidden]


def find_tensor(model_dir: Path, names: list[str]) -> torch.Tensor:
    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in names:
                if name in handle.keys():
                    return handle.get_tensor(name)
    raise KeyError(f"none of {names} in {model_dir}")


def load_shared_weights(model_dir: Path, dtype: torch.dtype, device: torch.device) -> SharedWeights:
    config = read_config(model_dir)
    embed = find_tensor(model_dir, ["model.embed_tokens.weight"])
    if config.get("tie_word_embeddings"):
        head = embed
    else:
        head = find_tensor(model_dir, ["lm_head.weight"])
    return SharedWeights(embed.to(device, dtype), head.to(device, dtype))


def load_target(model_dir: Path, device: torch.device, dtype: torch.dtype = torch.bfloat16):
    """The HF model, eval mode, no gradients (it only produces features)."""
    # deferred: imports transformers only when called
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model.requires_grad_(False)
    return model.eval().to(device)


def load_tokenizer(model_dir: Path):
    # deferred: imports transformers only when called
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)
