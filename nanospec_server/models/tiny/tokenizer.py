"""A tiny byte-level BPE tokenizer, trained offline on a corpus we ship.

Every tiny test model (see ``build.py``) carries a copy of these files so SGLang
and ``transformers.AutoTokenizer`` can load the tokenizer from the model path.
Training is deterministic: the same corpus and `tokenizers` version give the
same ``tokenizer.json`` bytes.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CORPUS_PATH = Path(__file__).parent / "data" / "tiny_corpus.txt"

# 997 is prime: deliberately not a multiple of anything a kernel might like, so
# code that silently assumes a padded vocabulary fails on the tiny models.
VOCAB_SIZE = 997

BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"
# The trainer assigns special tokens the first ids, in this order.
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2

MAX_LENGTH = 4096

# Minimal chat template: enough for /v1/chat/completions to render messages.
# BOS comes from the template (as for Llama 3), so the chat path does not get two.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@cache
def train_tokenizer() -> Tokenizer:
    """Train the byte-level BPE on the shipped corpus (cached per process)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 byte symbols, so any input text round-trips.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([CORPUS_PATH.read_text(encoding="utf-8")], trainer=trainer)
    if tokenizer.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(
            f"corpus too small: trained {tokenizer.get_vocab_size()} tokens, want {VOCAB_SIZE}"
        )
    for token_id, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != token_id:
            raise RuntimeError(f"special token {token!r} did not get id {token_id}")
    # Prepend BOS on plain encodes, as Llama tokenizers do.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, BOS_ID)],
    )
    return tokenizer


def tokenizer_config() -> dict[str, object]:
    """The ``tokenizer_config.json`` that makes the files a HF fast tokenizer."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "model_max_length": MAX_LENGTH,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def write_tokenizer(out_dir: Path) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``out_dir``."""
    tokenizer = train_tokenizer()
    (out_dir / "tokenizer.json").write_text(tokenizer.to_str(pretty=True), encoding="utf-8")
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
