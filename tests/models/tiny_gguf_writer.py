"""Test helper: write a tiny llama-architecture GGUF that transformers' GGUF loader can read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

HIDDEN = 32
LAYERS = 2
HEADS = 4
KV_HEADS = 2
FFN = 64
MERGES = ["h e", "l l", "he ll", "o w"]
SPECIAL_TOKENS = ["<s>", "</s>"]


@dataclass(frozen=True)
class TinyGguf:
    path: Path
    vocab_size: int
    bos_token_id: int
    embeddings: np.ndarray  # what `token_embd.weight` holds, in (vocab, hidden) order


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-printable-character table, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def write_tiny_llama_gguf(path: Path, seed: int = 0) -> TinyGguf:
    tokens = byte_alphabet() + ["he", "ll", "hell", "ow"] + SPECIAL_TOKENS
    vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        # multiples of 1/64 in a small range: exact in bf16, so a round trip compares equal
        return (rng.integers(-8, 9, size=shape) / 64).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - len(SPECIAL_TOKENS)) + [3] * len(SPECIAL_TOKENS))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(vocab - 2)
    writer.add_eos_token_id(vocab - 1)
    writer.add_add_bos_token(True)

    embeddings = weight(vocab, HIDDEN)
    writer.add_tensor("token_embd.weight", embeddings)
    kv_rows = HIDDEN * KV_HEADS // HEADS
    for layer in range(LAYERS):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", np.ones(HIDDEN, np.float32))
        writer.add_tensor(f"{prefix}.attn_q.weight", weight(HIDDEN, HIDDEN))
        writer.add_tensor(f"{prefix}.attn_k.weight", weight(kv_rows, HIDDEN))
        writer.add_tensor(f"{prefix}.attn_v.weight", weight(kv_rows, HIDDEN))
        writer.add_tensor(f"{prefix}.attn_output.weight", weight(HIDDEN, HIDDEN))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", np.ones(HIDDEN, np.float32))
        for name, shape in (("ffn_gate", (FFN, HIDDEN)), ("ffn_up", (FFN, HIDDEN))):
            _add_q8_0(writer, f"{prefix}.{name}.weight", weight(*shape))
        writer.add_tensor(f"{prefix}.ffn_down.weight", weight(HIDDEN, FFN))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    writer.add_tensor("output.weight", weight(vocab, HIDDEN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return TinyGguf(path, vocab, vocab - 2, embeddings)


def _add_q8_0(writer: gguf.GGUFWriter, name: str, data: np.ndarray) -> None:
    """A quantized tensor, so the conversion has something to dequantize."""
    qtype = gguf.GGMLQuantizationType.Q8_0
    writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
