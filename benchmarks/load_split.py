"""Where each batch of a `load_table.py` run spent its time, from the servers' forward logs.

Run the table with every server's forward log in its output folder, then split them:

    NANOSPEC_FORWARD_LOG=RUN/fwd python benchmarks/load_table.py --pair eagle --out RUN
    python benchmarks/load_split.py RUN

The table sends one batch at a time, so the forwards that start inside a batch's wall time
(`start_s` .. `start_s + wall_s` of its record, on the logs' clock) are that batch's,
whichever scheduler logged them. Per concurrency and round, each server's wall time, the
target's plain decode forwards (seconds / count), its prefills, every speculative forward
(verifies, draft steps, draft extends and catch-ups: seconds / verifies), and the rest of
the wall time (the host: scheduling, sampling, streaming, NanoSpec's bookkeeping); then the
sums per server. The ratio is plain decoding's wall time over the speculative server's.
"""

from __future__ import annotations

import argparse
import json
from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from forward_gaps import read


@dataclass
class BatchTime:
    wall: float
    decode: float = 0.0
    decodes: int = 0
    prefill: float = 0.0
    speculative: float = 0.0
    verifies: int = 0

    @property
    def host(self) -> float:
        return self.wall - self.decode - self.prefill - self.speculative

    def add(self, row: dict) -> None:
        if row["mode"] == "DECODE" and not row["draft"]:
            self.decode += row["seconds"]
            self.decodes += 1
        elif row["mode"] == "EXTEND" and not row["draft"]:
            self.prefill += row["seconds"]
        else:
            self.speculative += row["seconds"]
            self.verifies += row["mode"] == "TARGET_VERIFY"

    def absorb(self, other: BatchTime) -> None:
        self.wall += other.wall
        self.decode, self.decodes = self.decode + other.decode, self.decodes + other.decodes
        self.prefill += other.prefill
        self.speculative += other.speculative
        self.verifies += other.verifies

    def describe(self) -> str:
        return (f"wall {self.wall:6.2f}  decode {self.decode:6.2f}/{self.decodes:<4d} prefill "
                f"{self.prefill:5.2f}  speculative {self.speculative:5.2f}/{self.verifies:<3d} "
                f"host {self.host:5.2f}")  # fmt: skip


def split(run: Path) -> dict[tuple[int, int, str], BatchTime]:
    """(concurrency, round, server) -> its batch's time, for records that keep their start."""
    rows = sorted((r for log in run.glob("fwd.*") for r in read(log)), key=lambda r: r["start"])
    starts = [row["start"] for row in rows]
    batches = {}
    for line in (run / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "start_s" not in record:
            continue
        c, round_, name = record["key"].split("|")
        start, end = record["start_s"], record["start_s"] + record["wall_s"]
        batch = BatchTime(record["wall_s"])
        for row in rows[bisect_left(starts, start) : bisect_right(starts, end)]:
            batch.add(row)
        batches[int(c), int(round_), name] = batch
    return batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the load table's --out, holding fwd.PID logs")
    args = parser.parse_args()
    batches = split(args.run)
    for c in sorted({key[0] for key in batches}):
        print(f"c = {c}")
        sums: dict[str, BatchTime] = defaultdict(lambda: BatchTime(0.0))
        for round_ in sorted({key[1] for key in batches if key[0] == c}):
            here = {name: b for (cc, r, name), b in batches.items() if (cc, r) == (c, round_)}
            if {"plain", "adaptive"} <= set(here):
                ratio = here["plain"].wall / here["adaptive"].wall
                print(f"  round {round_}: plain / adaptive {ratio:.3f}")
            for name, batch in sorted(here.items()):
                print(f"    {name:9s} {batch.describe()}")
                sums[name].absorb(batch)
        for name, total in sorted(sums.items()):
            print(f"  sum {name:9s} {total.describe()}")


if __name__ == "__main__":
    main()
