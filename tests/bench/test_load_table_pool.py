"""benchmarks/load_table.py --report --pool: rounds of several runs in one table, and the
flag refused where it has nothing to read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks/load_table.py"


def write_run(run: Path, adaptive_walls: list[float]) -> None:
    """Rounds at c = 2 where plain decoding takes 1 s and adaptive speculation the given
    walls, every output equal."""
    run.mkdir()
    lines = []
    for round_, wall in enumerate(adaptive_walls):
        for name, seconds in (("plain", 1.0), ("adaptive", wall)):
            item = {
                "completion_tokens": 10,
                "chunk_s": [0.1, 0.2, seconds],
                "output_ids": [round_, 1, 2],
                "nanospec": {"draft_steps": 1, "plain_steps": 9} if name == "adaptive" else {},
            }
            record = {"key": f"2|{round_}|{name}", "wall_s": seconds, "items": [item, item]}
            lines.append(json.dumps(record))
    (run / "records.jsonl").write_text("\n".join(lines) + "\n")


def report(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), "--report", "--concurrency", "2", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def adaptive_row(output: str) -> list[str]:
    row = next(line for line in output.splitlines() if line.startswith("| 2 | adaptive"))
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_pooled_rounds_give_one_median_over_every_run(tmp_path: Path) -> None:
    write_run(tmp_path / "a", [1 / 0.9] * 3)  # three rounds at 0.9x plain decoding
    write_run(tmp_path / "b", [1 / 1.1] * 4)  # four at 1.1x
    alone = report("--out", str(tmp_path / "a"))
    pooled = report("--out", str(tmp_path / "a"), "--pool", str(tmp_path / "b"))
    assert alone.returncode == 0 and pooled.returncode == 0, alone.stderr + pooled.stderr
    assert adaptive_row(alone.stdout)[3].startswith("**0.900**")
    row = adaptive_row(pooled.stdout)
    assert row[3].startswith("**1.100**")  # the median of 3 x 0.9 and 4 x 1.1
    assert row[7] == "14/14"  # every round's outputs compared with its own run's plain
    assert row[8] == "14 / 126"  # both runs' request statistics


def test_pool_is_refused_without_report_or_records(tmp_path: Path) -> None:
    write_run(tmp_path / "a", [1.0])
    command = [sys.executable, str(SCRIPT), "--out", str(tmp_path / "a"), "--pool", str(tmp_path / "a")]  # fmt: skip
    without_report = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert without_report.returncode == 2 and "--pool" in without_report.stderr
    empty = report("--out", str(tmp_path / "a"), "--pool", str(tmp_path / "none"))
    assert empty.returncode == 2 and "--pool: no records.jsonl" in empty.stderr
