"""The concurrency table from `nanospec bench run --analysis adaptive` runs.

Per concurrency and speculative configuration, against the plain-decoding server of the
same group (side by side): total tokens per second and their ratio, the median of the
per-batch ratios with its bootstrap 95% interval, request latency (median / p90), how many
outputs equal plain decoding's, and for the adaptive configuration the steps it drafted
and decoded plainly, the tokens drafted per step and the acceptance length.

    python benchmarks/concurrency_table.py RUN_DIR/records.jsonl [...]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
from bootstrap import bootstrap_median

PLAIN = "ar"


def tokens_per_s(record: dict) -> float:
    return sum(item["completion_tokens"] for item in record["items"]) / record["wall_s"]


def total_rate(records: list[dict]) -> float:
    tokens = sum(item["completion_tokens"] for r in records for item in r["items"])
    return tokens / sum(r["wall_s"] for r in records)


def describe(config: str, batches: list[dict]) -> str:
    plain = total_rate([b[PLAIN] for b in batches])
    mine = total_rate([b[config] for b in batches])
    median, low, high = bootstrap_median(
        [tokens_per_s(b[config]) / tokens_per_s(b[PLAIN]) for b in batches]
    )
    latency = [item["latency_s"] for b in batches for item in b[config]["items"]]
    plain_latency = [item["latency_s"] for b in batches for item in b[PLAIN]["items"]]
    pairs = [
        (i, j) for b in batches for i, j in zip(b[config]["items"], b[PLAIN]["items"], strict=True)
    ]
    same = sum(i["output_ids"] == j["output_ids"] for i, j in pairs)
    line = (
        f"{config}: {len(batches)} batches, plain {plain:.2f} tok/s, {mine:.2f} ({mine / plain:.3f}x), "
        f"per-batch median {median:.3f} [{low:.3f}-{high:.3f}], latency "
        f"{np.median(latency):.2f}/{np.percentile(latency, 90):.2f} s (plain "
        f"{np.median(plain_latency):.2f}/{np.percentile(plain_latency, 90):.2f}), "
        f"{same}/{len(pairs)} outputs equal"
    )
    stats = [i["nanospec"] for b in batches for i in b[config]["items"] if i["nanospec"]]
    if stats and any(s.get("plain_steps") for s in stats):
        drafting = sum(s["draft_steps"] for s in stats)
        plain_steps = sum(s["plain_steps"] for s in stats)
        drafted = sum(s["drafted_tokens"] or 0 for s in stats)
        emitted = sum(s["emitted_tokens"] - s["plain_steps"] for s in stats)
        line += (
            f", {drafting} drafting + {plain_steps} plain steps, "
            f"{drafted / max(1, drafting + plain_steps):.2f} drafted per step, "
            f"acceptance length {emitted / max(1, drafting):.2f}"
        )
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("records", type=Path, nargs="+")
    for path in parser.parse_args().records:
        records = [r for r in map(json.loads, path.read_text().splitlines()) if "config" in r]
        groups: dict[tuple, dict[str, dict]] = defaultdict(dict)
        for record in records:
            batch = record["key"].split("|", 2)[2]  # turn, repeat, concurrency, prompts
            groups[record["group"], record["concurrency"], batch][record["config"]] = record
        print(path)
        configs = sorted({r["config"] for r in records} - {PLAIN})
        for concurrency in sorted({key[1] for key in groups}):
            print(f"concurrency {concurrency}")
            for config in configs:
                batches = [
                    by_config for key, by_config in groups.items()
                    if key[1] == concurrency and config in by_config and PLAIN in by_config
                ]  # fmt: skip
                if batches:
                    print("  " + describe(config, batches))


if __name__ == "__main__":
    main()
