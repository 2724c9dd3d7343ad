"""SGLang's own load client runs against `nanospec serve` on the CPU install."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from nanospec_server.models.tiny import tiny_model_path
from tests.admin.conftest import Server


def test_sglang_bench_serving_drives_the_server(server: Server, tmp_path: Path) -> None:
    results = tmp_path / "bench.jsonl"
    command = [
        sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang",
        "--base-url", server.url, "--tokenizer", str(tiny_model_path("tiny-target")),
        "--dataset-name", "random-ids", "--random-input-len", "16", "--random-output-len", "8",
        "--num-prompts", "4", "--max-concurrency", "2", "--output-file", str(results),
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(results.read_text().splitlines()[-1])
    assert report["completed"] == 4 and report["total_output_tokens"] > 0
