"""Convert a GGUF into a Hugging Face checkpoint (bf16 safetensors, tokenizer, config).

Goes through transformers' own GGUF loader, fully dequantized, then saves. Written into a temp
folder and renamed into place; a marker naming the source sha256 makes a rerun a no-op.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from nanospec_server.models.errors import ConversionError

MARKER_NAME = "nanospec_source.json"
TARGET_DTYPE = "bfloat16"
# Bump when the conversion changes, so checkpoints written by an older one are redone.
CONVERTER_VERSION = 2
# GGUF flags that transformers' GGUF tokenizer loader ignores, and the tokenizer attribute for each
SPECIAL_TOKEN_FLAGS = {
    "tokenizer.ggml.add_bos_token": "add_bos_token",
    "tokenizer.ggml.add_eos_token": "add_eos_token",
}


@dataclass(frozen=True)
class ModelShape:
    vocab_size: int
    hidden_size: int
    num_layers: int


def read_marker(hf_dir: Path) -> dict | None:
    try:
        return json.loads((hf_dir / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return None


def is_converted(hf_dir: Path, source_sha256: str) -> bool:
    marker = read_marker(hf_dir)
    return (
        marker is not None
        and marker.get("source_sha256") == source_sha256
        and marker.get("converter_version") == CONVERTER_VERSION
    )


def convert_gguf_to_hf(
    gguf_path: Path,
    hf_dir: Path,
    source_sha256: str,
    expected: ModelShape | None = None,
    progress: bool = True,
) -> Path:
    """Write `hf_dir` from `gguf_path` unless it already holds this source's conversion."""
    if is_converted(hf_dir, source_sha256):
        return hf_dir
    hf_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(hf_dir)
    staging = hf_dir.with_name(f".{hf_dir.name}.tmp-{os.getpid()}")
    steps = tqdm(total=4, desc=f"convert {gguf_path.name}", unit="step", disable=not progress)
    try:
        with steps:
            steps.set_postfix_str("tokenizer")
            tokenizer = _load_tokenizer(gguf_path)
            steps.update()
            steps.set_postfix_str("weights (dequantize)")
            model = _load_dense_model(gguf_path)
            shape = _shape_of(model)
            if expected is not None and shape != expected:
                raise ConversionError(
                    f"{gguf_path.name}: converted shape {shape}, expected {expected}"
                )
            steps.update()
            steps.set_postfix_str("save weights")
            _drop_gguf_quantizer(model)
            model.save_pretrained(staging)
            steps.update()
            steps.set_postfix_str("save tokenizer")
            tokenizer.save_pretrained(staging)
            _write_marker(staging, gguf_path, source_sha256, shape)
            steps.update()
        _swap_into_place(staging, hf_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return hf_dir


def _load_tokenizer(gguf_path: Path):
    # deferred: imports transformers only when called
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    # transformers raises plain ValueError/KeyError for files it does not support
    except Exception as error:
        raise ConversionError(
            f"transformers cannot read the tokenizer of {gguf_path.name}: {error}"
        ) from error
    _apply_special_token_flags(tokenizer, gguf_path)
    return tokenizer


def _apply_special_token_flags(tokenizer, gguf_path: Path) -> None:
    """Honour the file's add-BOS/EOS flags (Gemma needs its BOS; the loader drops the flag)."""
    # deferred: imports gguf only when called
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    for key, attribute in SPECIAL_TOKEN_FLAGS.items():
        field = reader.get_field(key)
        if field is None:
            continue
        wanted = bool(field.contents())
        if getattr(tokenizer, attribute, None) != wanted:
            setattr(tokenizer, attribute, wanted)


def _load_dense_model(gguf_path: Path):
    """The model with every weight dequantized to bf16 (never left packed in GGUF blocks)."""
    # deferred: imports torch, transformers only when called
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent),
            gguf_file=gguf_path.name,
            dtype=torch.bfloat16,
            quantization_config=GgufConfig(dequantize=True),
            low_cpu_mem_usage=True,
        )
    except Exception as error:
        raise ConversionError(
            f"transformers cannot load the weights of {gguf_path.name}: {error}"
        ) from error
    packed = sorted(
        {str(p.dtype) for p in model.state_dict().values() if p.dtype != torch.bfloat16}
    )
    if packed:
        raise ConversionError(
            f"{gguf_path.name}: weights left in dtypes {packed}, not {TARGET_DTYPE}"
        )
    return model


def _shape_of(model) -> ModelShape:
    return ModelShape(
        vocab_size=int(model.get_input_embeddings().weight.shape[0]),
        hidden_size=int(model.config.hidden_size),
        num_layers=int(model.config.num_hidden_layers),
    )


def _drop_gguf_quantizer(model) -> None:
    """transformers refuses to save a GGUF-loaded model while it still names its quantizer."""
    model.hf_quantizer = None
    for config in (model.config, getattr(model.config, "text_config", None)):
        if config is not None and hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
    if hasattr(model, "is_quantized"):
        try:
            model.is_quantized = False
        except AttributeError:  # a read-only property on some versions
            pass


def _write_marker(staging: Path, gguf_path: Path, source_sha256: str, shape: ModelShape) -> None:
    # deferred: imports transformers only when called
    import transformers

    marker = {
        "source_sha256": source_sha256,
        "source_file": gguf_path.name,
        "converter_version": CONVERTER_VERSION,
        "dtype": TARGET_DTYPE,
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "num_layers": shape.num_layers,
        "transformers_version": transformers.__version__,
    }
    (staging / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")


def _swap_into_place(staging: Path, hf_dir: Path) -> None:
    old = hf_dir.with_name(f".{hf_dir.name}.old-{os.getpid()}")
    if hf_dir.exists():
        os.replace(hf_dir, old)
    os.replace(staging, hf_dir)
    shutil.rmtree(old, ignore_errors=True)


def _remove_stale_temps(hf_dir: Path) -> None:
    """Leftovers of a conversion that was killed midway (its process is gone)."""
    for pattern in (f".{hf_dir.name}.tmp-*", f".{hf_dir.name}.old-*"):
        for stale in hf_dir.parent.glob(pattern):
            if not _process_alive(stale.name.rsplit("-", 1)[-1]):
                shutil.rmtree(stale, ignore_errors=True)


def _process_alive(pid_text: str) -> bool:
    if not pid_text.isdigit() or int(pid_text) == os.getpid():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
