"""Spec-Bench prompts (``../shared/data/specbench/question.jsonl``), read by path, never copied.

``NANOSPEC_SPECBENCH`` points elsewhere when the checkout is not beside ``shared/``.
"""

from __future__ import annotations

import json
from pathlib import Path

from nanospec_server.env import specbench
from nanospec_server.models.chat import encode_user_turns

DEFAULT_PATH = Path(__file__).resolve().parents[3] / "shared/data/specbench/question.jsonl"


def spec_bench_path() -> Path:
    return Path(raw if (raw := specbench()) is not None else DEFAULT_PATH)


def first_turns(count: int, path: Path | None = None) -> list[str]:
    """The first turn of ``count`` questions, one per category in turn (file order)."""
    rows = [json.loads(line) for line in (path or spec_bench_path()).read_text().splitlines() if line.strip()]  # fmt: skip
    by_category: dict[str, list[str]] = {}
    for row in rows:
        by_category.setdefault(row["category"], []).append(row["turns"][0])
    picked: list[str] = []
    while len(picked) < count and any(by_category.values()):
        for turns in by_category.values():
            if turns and len(picked) < count:
                picked.append(turns.pop(0))
    return picked


def spec_bench_prompts(tokenizer_dir: Path, count: int) -> list[list[int]]:
    """``first_turns`` as token ids, wrapped in the target's chat template."""
    # deferred: imports transformers only when called
    from transformers import AutoTokenizer

    return encode_user_turns(AutoTokenizer.from_pretrained(str(tokenizer_dir)), first_turns(count))
