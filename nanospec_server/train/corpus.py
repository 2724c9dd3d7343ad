"""The training corpus: Python source files of this interpreter's standard library.

Why: it is on every machine without a download, it is code (the targets are coder
models), and it is fixed for a given Python version, so runs are reproducible.
It shares nothing with the benchmarks (Spec-Bench, HumanEval prompts).

Split: a file goes to validation when the first byte of sha256(relative path) is
below ``VAL_BYTE_CUTOFF`` (~5% of files), so the split is by file (no validation
text leaks into training) and does not depend on the order files are listed in.
"""

from __future__ import annotations

import functools
import hashlib
import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

# Generous upper bound on characters per token for code (typical is ~3-4).
CHARS_PER_TOKEN_BOUND = 8
VAL_BYTE_CUTOFF = 13  # 13/256 ~ 5% of files
# Directories whose files are skipped: the stdlib's own test suite is huge and
# repetitive (it would dominate a small token budget), site-packages is not stdlib.
SKIP_DIRS = {"test", "tests", "site-packages", "idle_test", "lib2to3"}


class Split(str, Enum):
    TRAIN = "train"
    VAL = "val"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relative_path: str) -> Split:
    first_byte = hashlib.sha256(relative_path.encode()).digest()[0]
    return Split.VAL if first_byte < VAL_BYTE_CUTOFF else Split.TRAIN


def corpus_files(split: Split, root: Path | None = None) -> list[Path]:
    """The ``.py`` files of ``split`` under ``root`` (default: the stdlib), sorted."""
    return list(_split_files(root or stdlib_root())[split])


@functools.cache
def _split_files(root: Path) -> dict[Split, tuple[Path, ...]]:
    """One walk of ``root`` for both splits (cached: the stdlib does not change)."""
    files: dict[Split, list[Path]] = {Split.TRAIN: [], Split.VAL: []}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if not SKIP_DIRS.intersection(relative.parts[:-1]):
            files[split_of(relative.as_posix())].append(path)
    return {split: tuple(paths) for split, paths in files.items()}


@dataclass(frozen=True)
class CorpusSpec:
    """What token sequences to cut: ``num_tokens`` in rows of ``seq_len``."""

    split: Split
    num_tokens: int
    seq_len: int
    seed: int
    # At most this many rows per file, so a small budget still spans many modules.
    max_rows_per_file: int = 2


def _file_rows(token_ids: list[int], seq_len: int, max_rows: int) -> Iterator[list[int]]:
    for start in range(0, min(len(token_ids), seq_len * max_rows), seq_len):
        row = token_ids[start : start + seq_len]
        if len(row) == seq_len:
            yield row


def token_rows(spec: CorpusSpec, encode, root: Path | None = None) -> list[list[int]]:
    """Rows of exactly ``seq_len`` token ids, ``num_tokens // seq_len`` of them at most.

    Files are visited in a seeded shuffle; a file shorter than one row is skipped.
    ``encode`` maps text to token ids (the target's tokenizer).
    """
    files = corpus_files(spec.split, root)
    random.Random(spec.seed).shuffle(files)
    wanted = max(1, spec.num_tokens // spec.seq_len)
    rows: list[list[int]] = []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        # Only the file's first rows are used: skip tokenizing the rest of a long file.
        text = text[: spec.seq_len * spec.max_rows_per_file * CHARS_PER_TOKEN_BOUND]
        rows.extend(_file_rows(encode(text), spec.seq_len, spec.max_rows_per_file))
        if len(rows) >= wanted:
            break
    return rows[:wanted]
