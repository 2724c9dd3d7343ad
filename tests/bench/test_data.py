"""Loaders on small fixture files written here (never copies of Spec-Bench)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from nanospec_server.bench.data import (
    TASKS,
    DataError,
    load_humaneval,
    load_specbench,
    select,
)

ROWS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
    {"question_id": 2, "category": "coding", "turns": ["Sort a list.", "In C."]},
    {"question_id": 3, "category": "translation", "turns": ["Translate: Hallo Welt"]},
    {"question_id": 4, "category": "summarization", "turns": ["Summarize: a long text"]},
    {"question_id": 5, "category": "qa", "turns": ["Who wrote Faust?"]},
    {"question_id": 6, "category": "math_reasoning", "turns": ["2 + 2 = ?"]},
    {"question_id": 7, "category": "rag", "turns": ["Context: ... Question: ..."]},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_specbench_categories_become_the_papers_tasks(tmp_path: Path) -> None:
    prompts = load_specbench(write_jsonl(tmp_path / "q.jsonl", ROWS))
    assert [p.task for p in prompts] == ["conversation", "conversation", "translation",
                                         "summarization", "qa", "math", "rag"]  # fmt: skip
    assert prompts[0].turns == ("Write a poem.", "Now shorter.")  # MT-bench keeps two turns
    assert prompts[2].turns == ("Translate: Hallo Welt",)
    assert len({p.id for p in prompts}) == len(prompts)


@pytest.mark.parametrize(
    "row, message",
    [({"question_id": 1, "category": "poetry", "turns": ["x"]}, "unknown category"),
     ({"question_id": 1, "turns": ["x"]}, "not a Spec-Bench question"),
     ({"question_id": 1, "category": "qa", "turns": []}, "non-empty")],
)  # fmt: skip
def test_bad_specbench_rows_name_the_line(tmp_path: Path, row: dict, message: str) -> None:
    path = write_jsonl(tmp_path / "q.jsonl", [ROWS[0], row])
    with pytest.raises(DataError, match=rf"q.jsonl:2: .*{message}"):
        load_specbench(path)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no Spec-Bench file"):
        load_specbench(tmp_path / "absent.jsonl")


def test_humaneval_from_a_gzip_fixture_and_the_package(tmp_path: Path) -> None:
    path = tmp_path / "he.jsonl.gz"
    with gzip.open(path, "wt") as out:
        out.write(json.dumps({"task_id": "HumanEval/0", "prompt": "def f(x):\n"}) + "\n")
    (prompt,) = load_humaneval(path)
    assert prompt.id == "code/HumanEval/0" and prompt.task == "code"
    assert "def f(x):" in prompt.turns[0] and "```python" in prompt.turns[0]
    assert len(load_humaneval()) == 164  # the registry package's file


def test_select_is_seeded_per_task_and_independent_of_other_tasks(tmp_path: Path) -> None:
    rows = [{"question_id": i, "category": "qa", "turns": [f"q{i}"]} for i in range(20)]
    rows += [{"question_id": 100 + i, "category": "rag", "turns": [f"r{i}"]} for i in range(20)]
    prompts = load_specbench(write_jsonl(tmp_path / "q.jsonl", rows))
    a = select(prompts, 3, seed=0)
    assert [p.task for p in a] == ["qa"] * 3 + ["rag"] * 3
    assert a == select(prompts, 3, seed=0)
    assert a != select(prompts, 3, seed=1)
    only_rag = select(prompts, 3, seed=0, tasks=("rag",))
    assert only_rag == a[3:]  # adding qa does not change rag's draw
    assert len(select(prompts, None, seed=0)) == 40
    assert set(TASKS) >= {p.task for p in a}
