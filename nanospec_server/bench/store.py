"""A run's directory: ``run.json`` (provenance, settings) and ``records.jsonl`` (one line per
finished batch, appended and flushed as it finishes, so an interrupted run resumes where
it stopped)."""

from __future__ import annotations

import json
from pathlib import Path


class RunMismatch(ValueError):
    pass


class ResultStore:
    def __init__(self, run_dir: Path) -> None:
        self.dir = run_dir
        self.records_path = run_dir / "records.jsonl"
        self.records: dict[str, dict] = {}
        if self.records_path.is_file():
            text = self.records_path.read_text(encoding="utf-8")
            if text and not text.endswith("\n"):
                # End the line an interruption cut short, so the next record starts clean.
                with self.records_path.open("a", encoding="utf-8") as out:
                    out.write("\n")
            for line in text.splitlines():
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a line cut short by the interruption: its batch runs again
                self.records[record["key"]] = record

    def start(self, info: dict) -> None:
        """Write ``run.json``, or check that an existing run has the same settings."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / "run.json"
        if path.is_file():
            previous = json.loads(path.read_text(encoding="utf-8"))
            if previous["settings"] != info["settings"]:
                changed = sorted(
                    k for k in info["settings"] | previous["settings"]
                    if info["settings"].get(k) != previous["settings"].get(k)
                )  # fmt: skip
                raise RunMismatch(
                    f"{self.dir} holds a run with other settings ({', '.join(changed)}); "
                    "use another --out to start a new run"
                )
            info = previous | {"resumed": previous.get("resumed", 0) + 1}
        path.write_text(json.dumps(info, indent=2), encoding="utf-8")

    def info(self) -> dict:
        return json.loads((self.dir / "run.json").read_text(encoding="utf-8"))

    def __contains__(self, key: str) -> bool:
        return key in self.records

    def add(self, record: dict) -> None:
        with self.records_path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(record) + "\n")
            out.flush()
        self.records[record["key"]] = record
