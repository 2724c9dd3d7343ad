"""FR-Spec's static draft vocabulary: the k most frequent tokens of a corpus.

Writes the file SGLang reads with `--speculative-token-map` (a saved list of token ids),
which our `static` mode uses as the comparison baseline.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch


def corpus_texts(paths: Iterable[Path]) -> Iterator[str]:
    """Plain text files whole; JSONL files line by line (`text`, or the strings of `turns`)."""
    for path in paths:
        if path.suffix != ".jsonl":
            yield path.read_text(encoding="utf-8", errors="replace")
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            if "text" in record:
                yield record["text"]
            yield from (t for t in record.get("turns", []) if isinstance(t, str))


def top_k_token_ids(
    tokenizer, texts: Iterable[str], k: int, always: Iterable[int] = ()
) -> list[int]:
    """The k most frequent token ids (ties broken by id), always-kept ids first."""
    counts: Counter[int] = Counter()
    for text in texts:
        counts.update(tokenizer.encode(text, add_special_tokens=False))
    kept = list(dict.fromkeys(always))
    ranked = sorted(counts, key=lambda token: (-counts[token], token))
    for token in ranked:
        if len(kept) >= k:
            break
        if token not in kept:
            kept.append(token)
    return kept[:k]


def build_token_map(tokenizer_path: Path, corpus: list[Path], k: int, output: Path) -> int:
    # deferred: imports transformers only when called
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path))
    always = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    ids = top_k_token_ids(tokenizer, corpus_texts(corpus), k, always)
    output.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ids, output)
    return len(ids)
