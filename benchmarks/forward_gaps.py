"""Where two servers' decode steps spend their time, from their forward logs.

Start both servers with ``NANOSPEC_FORWARD_LOG=PREFIX`` (each scheduler process writes
``PREFIX.PID``, `sglang_plugin/stats/forward_log.py`), drive the same load through both
(`load_table.py` does), then compare the two logs:

    NANOSPEC_FORWARD_LOG=/tmp/fwd python benchmarks/load_table.py --pair eagle --out RUN
    python benchmarks/forward_gaps.py /tmp/fwd.PLAIN_PID /tmp/fwd.SPEC_PID

Per batch size of the target's plain decode forwards (`DECODE`, not the draft's): how many,
the median forward and the median gap before it (the step outside the model: scheduling,
sampling, bookkeeping); then every other kind of forward's count and total seconds (a
speculative server's verifies, draft steps, catch-ups and prefills).
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

from nanospec_server.sglang_plugin.stats.forward_log import FIELDS


def read(path: Path) -> list[dict]:
    """The log's lines as dicts keyed by the writer's `FIELDS`, with numbers parsed."""
    rows = []
    for text in path.read_text().splitlines():
        row = dict(zip(FIELDS, text.split(), strict=True))
        for name in ("start", "seconds", "gap", "gc"):
            row[name] = float(row[name])
        row["batch"], row["kv"] = int(row.pop("batch_size")), int(row.pop("kv_tokens"))
        row["draft"] = row["draft"] == "1"
        rows.append(row)
    return rows


def decode_by_batch(rows: list[dict]) -> dict[int, tuple[int, float, float]]:
    """Batch size -> (forwards, median forward ms, median gap ms) of target decodes."""
    by_batch: dict[int, list[dict]] = defaultdict(list)
    for row in rows:
        if row["mode"] == "DECODE" and not row["draft"] and row["gap"] >= 0:
            by_batch[row["batch"]].append(row)
    return {
        batch: (
            len(group),
            1000 * statistics.median(r["seconds"] for r in group),
            1000 * statistics.median(r["gap"] for r in group),
        )  # fmt: skip
        for batch, group in sorted(by_batch.items())
    }


def other_forwards(rows: list[dict]) -> dict[str, tuple[int, float]]:
    totals: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if row["mode"] != "DECODE" or row["draft"]:
            totals[f"{row['mode']}{' (draft)' if row['draft'] else ''}"].append(row["seconds"])
    return {kind: (len(seconds), sum(seconds)) for kind, seconds in sorted(totals.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("baseline", type=Path, help="plain decoding's forward log")
    parser.add_argument("other", type=Path, help="the speculative server's forward log")
    parser.add_argument("--min-forwards", type=int, default=20, help="batch sizes shown")
    args = parser.parse_args()
    base, other = read(args.baseline), read(args.other)
    a, b = decode_by_batch(base), decode_by_batch(other)
    print("| batch | forwards | forward ms | gap ms | forwards | forward ms | gap ms |")
    print("|---|---|---|---|---|---|---|")
    for batch in sorted(set(a) & set(b)):
        if min(a[batch][0], b[batch][0]) >= args.min_forwards:
            x, y = a[batch], b[batch]
            print(
                f"| {batch} | {x[0]} | {x[1]:.1f} | {x[2]:.1f} | {y[0]} | {y[1]:.1f} | {y[2]:.1f} |"
            )
    for name, rows in (("baseline", base), ("other", other)):
        decode = sum(r["seconds"] for r in rows if r["mode"] == "DECODE" and not r["draft"])
        gaps = sum(r["gap"] for r in rows if 0 <= r["gap"] < 5)  # idle time between loads aside
        collected = sum(r["gc"] for r in rows)
        print(f"{name}: target decode forwards {decode:.1f} s, gaps under 5 s {gaps:.1f} s, "
              f"garbage collection {collected:.2f} s")  # fmt: skip
        for kind, (count, seconds) in other_forwards(rows).items():
            print(f"  {kind}: {count} forwards, {seconds:.1f} s")


if __name__ == "__main__":
    main()
