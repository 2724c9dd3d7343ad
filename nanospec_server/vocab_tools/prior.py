"""The static prior P of the hybrid vocabulary: the k most frequent tokens of a fixed corpus.

NanoSpec drafts from I = Unique(Suffix(S, W_max)); the hybrid vocabulary (beyond the
paper) drafts from I ∪ P, so frequent tokens the window has not seen yet (punctuation,
function words, markdown) stay draftable. P travels as pinned rows of the packed head,
the way end-of-sequence ids already do (`vocab.DynamicVocab(always_active=...)`).

The corpus is this repository's own and no benchmark's: the prose docstrings of this
interpreter's standard library and the trainer's training prompts
(`train/prompts.py`). Counting it takes tens of seconds, so the ranking is computed once
per tokenizer and cached under ``<cache root>/priors``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

from nanospec_server.models.paths import cache_root
from nanospec_server.train.prompts import Split, chat_prompts, stdlib_prose
from nanospec_server.vocab_tools.token_map import top_k_token_ids

PRIOR_VERSION = 1  # bump when the corpus changes: cached rankings are then recomputed
CORPUS_PROMPTS = 2000


def prior_corpus() -> Iterator[str]:
    paragraphs, sentences = stdlib_prose()
    yield from paragraphs
    yield from sentences
    yield from chat_prompts(Split.TRAIN, CORPUS_PROMPTS, seed=0)


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


def ranked_tokens(tokenizer, root: Path | None = None) -> list[int]:
    """Every token id the corpus holds, most frequent first (ties by id), cached on disk."""
    path = (root or cache_root() / "priors") / f"v{PRIOR_VERSION}-{tokenizer_fingerprint(tokenizer)}.json"  # fmt: skip
    if path.is_file():
        return json.loads(path.read_text())
    ranked = top_k_token_ids(tokenizer, prior_corpus(), k=len(tokenizer.get_vocab()))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")  # concurrent servers: last rename wins
    tmp.write_text(json.dumps(ranked))
    tmp.rename(path)
    return ranked


def prior_token_ids(tokenizer, k: int, root: Path | None = None) -> list[int]:
    """P: the ``k`` most frequent corpus tokens (fewer if the corpus holds fewer)."""
    return ranked_tokens(tokenizer, root)[:k] if k > 0 else []
