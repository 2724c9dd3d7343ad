"""A corpus of assistant responses: read from files, or written by the target itself.

Trimming counts the tokens a draft must propose, which are the target's answers, not the
prompts. The self-distilled corpus is the trainer's (`train/distill.py`): the target
answers the trainer's own training prompts (`train/prompts.py`) greedily, so no benchmark
prompt is seen.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from tqdm import tqdm

from nanospec_server.models.chat import encode_chat
from nanospec_server.train.prompts import Split, chat_prompts


def assistant_texts(paths: Iterable[Path]) -> Iterator[str]:
    """JSONL records' ``answer``, the assistant turns of ``conversations``/``messages``,
    or ``text``; other files whole."""
    for path in paths:
        if path.suffix != ".jsonl":
            yield path.read_text(encoding="utf-8", errors="replace")
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not JSON ({error.msg})") from None
            yield from _answers_of(record)


def _answers_of(record: dict) -> Iterator[str]:
    if isinstance(record.get("answer"), str):
        yield record["answer"]
        return
    turns = record.get("conversations") or record.get("messages")
    if isinstance(turns, list):
        for turn in turns:
            role = turn.get("role") or turn.get("from")
            if role in ("assistant", "gpt"):
                yield turn.get("content") or turn.get("value") or ""
        return
    if isinstance(record.get("text"), str):
        yield record["text"]


def self_distilled_answers(
    model_dir: Path, count: int, max_new_tokens: int, seed: int = 0, batch: int = 8
) -> list[dict]:
    """The target's greedy answers to ``count`` of the trainer's training prompts:
    ``{"prompt", "prompt_ids", "answer_ids", "answer"}`` per prompt."""
    # deferred: imports torch only when called
    import torch

    from nanospec_server.train.distill import generate_rows
    from nanospec_server.train.target import load_target, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    target = load_target(model_dir, torch.device("cpu"), torch.float32)
    eos = {tokenizer.eos_token_id, *_generation_eos(model_dir)} - {None}
    prompts = chat_prompts(Split.TRAIN, count, seed)
    records = []
    for start in tqdm(range(0, count, batch), desc="answers", unit="batch"):
        texts = prompts[start : start + batch]
        ids = [encode_chat(tokenizer, [t], []) for t in texts]
        seq_len = max(map(len, ids)) + max_new_tokens
        rows = generate_rows(target, ids, seq_len, eos, torch.device("cpu"))
        for i, text in enumerate(texts):
            n, p = int(rows.lengths[i]), int(rows.prompt_lengths[i])
            # each row is cut at the longest prompt + max_new_tokens: no more than that
            answer = rows.input_ids[i, p : min(n, p + max_new_tokens)].tolist()
            records.append({"prompt": text, "prompt_ids": ids[i], "answer_ids": answer,
                            "answer": tokenizer.decode(answer)})  # fmt: skip
    return records


def _generation_eos(model_dir: Path) -> list[int]:
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text()).get("eos_token_id")
    return eos if isinstance(eos, list) else [eos]
