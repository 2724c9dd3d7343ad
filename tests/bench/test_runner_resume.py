"""An interrupted run resumes: stored batches are not sent again, the rest are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from nanospec_server.bench.configs import BenchConfig
from nanospec_server.bench.data import BenchPrompt
from nanospec_server.bench.runner import SideBySide
from nanospec_server.bench.schedule import Batch, plan
from nanospec_server.bench.store import ResultStore, RunMismatch
from nanospec_server.models.tiny import tiny_model_path

PROMPTS = [BenchPrompt("conversation/1", "conversation", ("Hi", "More")),
           BenchPrompt("qa/2", "qa", ("Why?",)), BenchPrompt("rag/3", "rag", ("Context",))]  # fmt: skip
CONFIGS = [BenchConfig("ar"), BenchConfig("other")]


class Interrupted(Exception):
    pass


class RecordingSender:
    """Answers each prompt with its own input ids reversed; fails after ``fail_after``."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.sent: list[str] = []
        self.inputs: dict[str, list[list[int]]] = {}
        self.fail_after = fail_after

    def __call__(self, batch: Batch, input_ids: list[list[int]]):
        if self.fail_after is not None and len(self.sent) == self.fail_after:
            raise Interrupted
        self.sent.append(batch.key)
        self.inputs[batch.key] = input_ids
        items = [{"prompt_id": p, "task": p.split("/")[0], "input_len": len(ids),
                  "output_ids": ids[::-1][:5], "completion_tokens": 5, "latency_s": 0.5,
                  "verify_steps": 2, "accept_length": 2.5, "nanospec": None}
                 for p, ids in zip(batch.prompt_ids, input_ids, strict=True)]  # fmt: skip
        return items, 0.5


def make_bench(
    run_dir: Path, config_groups: tuple[tuple[str, ...], ...] = (("ar", "other"),)
) -> tuple[SideBySide, list[Batch]]:
    store = ResultStore(run_dir)
    store.start({"settings": {"seed": 0}})
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path("tiny-target")))
    groups = [list(g) for g in config_groups]
    bench = SideBySide(CONFIGS, groups, PROMPTS, tokenizer, store, max_new_tokens=5)
    batches = plan(groups, {p.id: len(p.turns) for p in PROMPTS}, 1, [1])
    return bench, batches


def test_resume_sends_only_what_is_missing(tmp_path: Path) -> None:
    bench, batches = make_bench(tmp_path)
    first = RecordingSender(fail_after=3)
    with pytest.raises(Interrupted):
        bench.execute(batches, first)
    # A line cut short by the interruption is ignored and its batch sent again.
    with (tmp_path / "records.jsonl").open("a") as out:
        out.write('{"key": "g0|ar|t0|r0|c1|qa/2", "items": [')
    bench, batches = make_bench(tmp_path)
    second = RecordingSender()
    bench.execute(batches, second)
    assert first.sent + second.sent == [b.key for b in batches]
    records = ResultStore(tmp_path).records
    assert set(records) == {b.key for b in batches}


def test_second_turn_follows_ars_own_first_answer(tmp_path: Path) -> None:
    bench, batches = make_bench(tmp_path)
    sender = RecordingSender()
    bench.execute(batches, sender)
    ar_first = next(r for r in bench.store.records.values()
                    if r["config"] == "ar" and r["turn"] == 0 and r["items"][0]["prompt_id"] == "conversation/1")  # fmt: skip
    answer = bench.tokenizer.decode(ar_first["items"][0]["output_ids"], skip_special_tokens=True)
    second = [b for b in batches if b.turn == 1]
    assert {b.config for b in second} == {"ar", "other"}
    for b in second:
        (ids,) = sender.inputs[b.key]
        assert answer in bench.tokenizer.decode(ids)  # the same history for every config


def test_divergences_name_the_first_differing_token(tmp_path: Path) -> None:
    bench, batches = make_bench(tmp_path)
    bench.execute(batches, RecordingSender())
    assert bench.divergences(0) == []
    record = next(r for r in bench.store.records.values() if r["config"] == "other")
    record["items"][0]["output_ids"] = record["items"][0]["output_ids"][:2] + [999, 1]
    (found,) = bench.divergences(0)
    assert found["position"] == 2 and found["config_token"] == 999 and found["config"] == "other"


def test_a_run_dir_with_other_settings_is_refused(tmp_path: Path) -> None:
    ResultStore(tmp_path).start({"settings": {"seed": 0}})
    with pytest.raises(RunMismatch, match="seed"):
        ResultStore(tmp_path).start({"settings": {"seed": 1}})
    ResultStore(tmp_path).start({"settings": {"seed": 0}})
    assert json.loads((tmp_path / "run.json").read_text())["resumed"] == 1


def test_one_server_at_a_time_follows_and_checks_against_ar_of_group_0(tmp_path: Path) -> None:
    bench, batches = make_bench(tmp_path, (("ar",), ("other",)))
    sender = RecordingSender()
    bench.execute(batches, sender)
    ar_first = next(r for r in bench.store.records.values()
                    if r["config"] == "ar" and r["turn"] == 0 and r["items"][0]["prompt_id"] == "conversation/1")  # fmt: skip
    answer = bench.tokenizer.decode(ar_first["items"][0]["output_ids"], skip_special_tokens=True)
    (second,) = [b for b in batches if b.turn == 1 and b.group == 1]
    assert answer in bench.tokenizer.decode(sender.inputs[second.key][0])
    record = next(r for r in bench.store.records.values() if r["config"] == "other")
    record["items"][0]["output_ids"] = [999]
    (found,) = bench.divergences(1)
    assert found["config"] == "other" and found["position"] == 0
