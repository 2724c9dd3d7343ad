"""Plain decoding beside `nanospec serve` (adaptive speculation, its default on a CPU) under
load: streamed requests, throughput ratio per concurrency, latency, time to first token and
inter-token latency.

Both servers are up at once. At each concurrency c, each round sends a fresh batch of c
Spec-Bench first turns (shuffled with ``--seed``, each through the target's chat template,
greedy) to each server in turn, the order alternating by round (`williams_order`). A round's
throughput is its batch's completion tokens over the batch's wall time; per concurrency the
table gives the median of the rounds' ratios with its bootstrap 95% interval, each server's
total tokens per second, request latency (median, p90), time to first token (p50) and the
gap between streamed chunks (p50, p99: a speculative step streams all the tokens it accepted
in one chunk, as SGLang's own ``bench_serving`` counts it), and how many outputs equal plain
decoding's. At the concurrencies in ``--fixed-at`` each round also runs the speculative
server with adaptive speculation turned off live (``{"adaptive": false}``: the launch's
fixed depth), its radix cache emptied before the second of its two batches of a round, so
that neither row finds the round's prompts already prefilled by the other. At those in
``--control-at`` it also runs a second plain server, started with the pair: its row is
plain decoding against itself, the spread the host alone puts into a round's ratio (two
processes of the same code, the same batches, the same protocol).
Records go to ``--out/records.jsonl`` as each batch ends (a rerun skips those stored), the
table to ``--out/table.md``.

``--sessions N`` splits the rounds among N pairs of freshly started servers (round r in
pair r mod N). One server process can run its forwards 10-15% slower than another of the
same code on the same host, for minutes at a time or for its whole life (two speculative
servers of one commit beside one plain server, the same batches in rotating order: 0.88-0.94
against 0.98-1.02 of plain decoding's throughput, the slow one's every decode forward 10-15%
longer): with one pair, such a stretch sits in many rounds of the table. The servers of a
pair start one after the other, and which starts first alternates by pair
(``--start-order``).

    python benchmarks/load_table.py --pair default --out /tmp/load-default
    python benchmarks/load_table.py --pair eagle --out /tmp/load-eagle
    python benchmarks/load_table.py --out /tmp/load-eagle --report   # the table again
    python benchmarks/load_table.py --out RUN1 --pool RUN2 RUN3 --report   # rounds pooled

``--pool`` adds other runs' rounds to the report: one run's rows can sit ±5% from the next
draw's, and only rounds pooled over runs (each with its own prompts and server processes)
narrow that.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import requests
from bootstrap import bootstrap_median

from nanospec_server.bench.cli import shipped_eagle_head
from nanospec_server.bench.schedule import williams_order
from nanospec_server.bench.specbench import spec_bench_path
from nanospec_server.launch.server import running_servers, speculative_flags
from nanospec_server.models.chat import encode_user_turns
from nanospec_server.models.defaults import DEFAULT_CPU_PRIOR_K, default_serve_argv
from nanospec_server.models.paths import model_paths

ADMIN_KEY = "load-table-admin-key-0123456789"
PAIRS = {  # the speculative server's flags; the plain server serves its first two
    # what `nanospec serve` runs with no arguments (its prior is the embedded default's)
    "default": lambda: default_serve_argv() + ["--nanospec-prior-k", str(DEFAULT_CPU_PRIOR_K)],
    "eagle": lambda: (
        ["--model-path", str(model_paths("qwen2.5-coder-0.5b-instruct").hf_dir)]
        + speculative_flags("EAGLE", str(shipped_eagle_head()), 4, 1, 5)
    ),
}
SERVERS = ["plain", "adaptive", "fixed", "plain-2"]  # the table's rows per concurrency
RUN_ROUNDS = 10_000  # pooled runs' rounds are numbered apart by this (more than a run holds)
# Long-document categories make a round at c = 32 a prefill benchmark of minutes.
SKIPPED_CATEGORIES = ("summarization", "rag")


def without_flag(argv: list[str], flag: str) -> list[str]:
    """``argv`` without ``flag`` and its value (the table sets it the same on both servers)."""
    if flag not in argv:
        return argv
    at = argv.index(flag)
    return argv[:at] + argv[at + 2 :]


def prompt_ids(tokenizer_dir: str, count: int, seed: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    rows = [json.loads(line) for line in spec_bench_path().read_text().splitlines() if line]
    turns = [row["turns"][0] for row in rows if row["category"] not in SKIPPED_CATEGORIES]
    random.Random(seed).shuffle(turns)
    turns = (turns * (count // len(turns) + 1))[:count]
    return encode_user_turns(AutoTokenizer.from_pretrained(tokenizer_dir), turns)


def stream_one(url: str, ids: list[int], max_new: int) -> dict:
    """One streamed greedy request: its chunk arrival times and final output."""
    body = {
        "input_ids": ids,
        "stream": True,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new},
    }
    start, times, last = time.perf_counter(), [], {}
    with requests.post(f"{url}/generate", json=body, stream=True, timeout=3600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith(b"data: {"):
                times.append(time.perf_counter() - start)
                last = json.loads(line[len(b"data: ") :])
    meta = last.get("meta_info", {})
    stats = meta.get("nanospec")  # a streamed reply's last chunk carries its snapshot
    return {
        "chunk_s": times,
        "output_ids": last.get("output_ids", []),
        "completion_tokens": meta.get("completion_tokens", 0),
        "nanospec": stats[-1] if isinstance(stats, list) and stats else stats,
    }


def run_batch(url: str, batch: list[list[int]], max_new: int) -> dict:
    """The batch's requests at once; ``start_s`` is `time.perf_counter` at its start, the
    clock of the servers' forward logs (`NANOSPEC_FORWARD_LOG`), to split them per batch."""
    start = time.perf_counter()
    with ThreadPoolExecutor(len(batch)) as pool:
        items = list(pool.map(lambda ids: stream_one(url, ids, max_new), batch))
    return {"start_s": start, "wall_s": time.perf_counter() - start, "items": items}


def set_adaptive(url: str, on: bool) -> None:
    response = requests.post(
        f"{url}/nanospec/settings",
        json={"adaptive": on},
        headers={"X-Admin-Key": ADMIN_KEY},
        timeout=60,
    )
    response.raise_for_status()


def flush_cache(url: str) -> None:
    """Empty the speculative server's radix cache: the second of its rows in a round would
    otherwise find the round's prompts cached by the first and skip their prefill. SGLang
    refuses (400) while a request is still in its scheduler, which a reply the client has
    read can be for a step or two: its ``timeout`` waits for the scheduler to idle."""
    response = requests.post(
        f"{url}/flush_cache",
        params={"timeout": 30},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=60,
    )
    response.raise_for_status()


def read_records(run: Path) -> dict[str, dict]:
    path = run / "records.jsonl"
    if not path.exists():
        return {}
    return {r["key"]: r for r in map(json.loads, path.read_text().splitlines())}


def pooled(runs: list[dict[str, dict]]) -> dict[str, dict]:
    """Several runs' records as one run's: run i's round r becomes round i * RUN_ROUNDS + r."""
    records = {}
    for index, run in enumerate(runs):
        for key, record in run.items():
            c, round_, name = key.split("|")
            records[f"{c}|{index * RUN_ROUNDS + int(round_)}|{name}"] = record
    return records


def tokens_per_s(record: dict) -> float:
    return sum(item["completion_tokens"] for item in record["items"]) / record["wall_s"]


def describe(name: str, rows: list[dict], plain_rows: list[dict]) -> list[str]:
    """The table's cells for one server at one concurrency (ratios to the plain rows)."""
    items = [item for row in rows for item in row["items"]]
    tokens = sum(item["completion_tokens"] for item in items)
    rate = tokens / sum(row["wall_s"] for row in rows)
    latency = [item["chunk_s"][-1] for item in items if item["chunk_s"]]
    ttft = [item["chunk_s"][0] for item in items if item["chunk_s"]]
    gaps = [float(gap) for item in items for gap in np.diff(item["chunk_s"])]
    cells = [name, f"{rate:.2f}"]
    if name == "plain":
        cells.append("-")
    else:
        ratios = [tokens_per_s(a) / tokens_per_s(p) for a, p in zip(rows, plain_rows, strict=True)]
        median, low, high = bootstrap_median(ratios)
        cells.append(f"**{median:.3f}** [{low:.3f}-{high:.3f}]")
    cells += [
        f"{np.median(latency):.2f} / {np.percentile(latency, 90):.2f}",
        f"{np.median(ttft):.2f}",
        f"{1000 * np.median(gaps):.0f} / {1000 * np.percentile(gaps, 99):.0f}" if gaps else "-",
    ]
    plain_items = [item for row in plain_rows for item in row["items"]]
    same = sum(a["output_ids"] == p["output_ids"] for a, p in zip(items, plain_items, strict=True))
    cells.append(f"{same}/{len(items)}")
    stats = [item["nanospec"] for item in items if item["nanospec"]]
    drafting = sum(s.get("draft_steps", 0) for s in stats)
    plain_steps = sum(s.get("plain_steps", 0) for s in stats)
    cells.append(f"{drafting} / {plain_steps}" if stats else "-")
    return cells


def table(records: dict[str, dict], concurrency: list[int]) -> str:
    header = (
        "| c | server | tok/s | per-round ratio to plain [95%] | latency p50 / p90 s "
        "| TTFT p50 s | chunk gap p50 / p99 ms | outputs equal plain | draft / plain steps |"
    )
    lines = [header, "|" + "---|" * 9]
    for c in concurrency:
        rounds = sorted({int(key.split("|")[1]) for key in records if key.startswith(f"{c}|")})
        plain_rows = [records[f"{c}|{r}|plain"] for r in rounds if f"{c}|{r}|plain" in records]
        for name in SERVERS:
            rows = [records.get(f"{c}|{r}|{name}") for r in rounds]
            if not rows or any(row is None for row in rows) or len(rows) != len(plain_rows):
                continue
            lines.append(f"| {c} | " + " | ".join(describe(name, rows, plain_rows)) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="default")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--rounds-at", nargs="*", default=[], metavar="C=N", help="fewer rounds at some c"
    )
    parser.add_argument("--fixed-at", type=int, nargs="*", default=[1])
    parser.add_argument(
        "--control-at",
        type=int,
        nargs="*",
        default=[],
        help="concurrencies where a second plain server runs each batch too (the noise floor)",
    )
    parser.add_argument(
        "--sessions",
        type=int,
        default=1,
        help="fresh server pairs the rounds are split among (round r in session r mod N)",
    )
    parser.add_argument(
        "--start-order",
        choices=["alternate", "plain-first"],
        default="alternate",
        help="which server of a pair starts first: alternating by pair, or plain decoding's",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--max-total-tokens", type=int, default=16384)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--report", action="store_true", help="the table of --out's records")
    parser.add_argument(
        "--pool",
        type=Path,
        nargs="+",
        default=[],
        metavar="RUN",
        help="with --report: more runs' folders, their rounds pooled with --out's",
    )
    args = parser.parse_args()
    if args.pool and not args.report:
        parser.error("--pool: only with --report (it reads runs, it runs nothing)")
    if missing := [str(run) for run in args.pool if not (run / "records.jsonl").exists()]:
        parser.error(f"--pool: no records.jsonl in {', '.join(missing)}")
    rounds_at = {int(c): int(n) for c, n in (item.split("=") for item in args.rounds_at)}

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "records.jsonl"
    records = read_records(args.out)
    if args.report:
        # one run pools to itself: run 0 keeps its round numbers
        print(table(pooled([records, *map(read_records, args.pool)]), args.concurrency))
        return
    spec = without_flag(PAIRS[args.pair](), "--max-total-tokens")
    limits = ["--max-total-tokens", str(args.max_total_tokens)]
    servers = {
        "plain": (spec[:2] + limits, args.out / "plain.log"),
        "speculative": (spec + limits + ["--admin-api-key", ADMIN_KEY], args.out / "spec.log"),
    }
    if args.control_at:
        servers["plain-2"] = (spec[:2] + limits, args.out / "plain-2.log")
    needed = sum(c * rounds_at.get(c, args.rounds) for c in args.concurrency)
    prompts = prompt_ids(spec[1], needed, args.seed)
    host = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line for line in host.splitlines() if "Model name" in line), "")
    print(f"{model.strip()}; speculative server: {' '.join(spec)}", flush=True)
    first_prompt, start = {}, 0  # each (c, round) keeps its batch whatever the sessions
    for c in args.concurrency:
        for round_ in range(rounds_at.get(c, args.rounds)):
            first_prompt[c, round_], start = start, start + c

    def servers_at(c: int) -> list[str]:
        fixed = ["fixed"] if c in args.fixed_at else []
        return ["plain", "adaptive"] + fixed + (["plain-2"] if c in args.control_at else [])

    for session in range(args.sessions):
        pending = [key for key in first_prompt if key[1] % args.sessions == session]
        if all(f"{c}|{r}|{name}" in records for c, r in pending for name in servers_at(c)):
            continue  # a rerun: this pair's batches are all stored
        # which server starts first alternates by pair (`--start-order`)
        first = "plain" if args.start_order == "plain-first" or session % 2 == 0 else "speculative"
        started = {first: servers[first]} | servers
        with running_servers(started, one_at_a_time=True) as urls, path.open("a") as out:
            for name in urls:  # a first request pays one-time costs outside the table
                run_batch(urls[name], prompts[:1], 8)
            for c in args.concurrency:
                for round_ in (r for cc, r in pending if cc == c):
                    batch = prompts[first_prompt[c, round_] : first_prompt[c, round_] + c]
                    names = servers_at(c)
                    order = williams_order(names, round_)
                    speculative_ran = False  # this round's batch, on the speculative server
                    for name in order:
                        key = f"{c}|{round_}|{name}"
                        if key in records:
                            continue
                        url = urls[name if name.startswith("plain") else "speculative"]
                        if not name.startswith("plain"):
                            if speculative_ran:
                                flush_cache(url)
                            speculative_ran = True
                            set_adaptive(url, name == "adaptive")
                        record = {"key": key, "session": session, "first": first}
                        record |= run_batch(url, batch, args.max_new_tokens)
                        records[key] = record
                        out.write(json.dumps(record) + "\n")
                        out.flush()
                        print(f"session {session} c={c} round {round_} {name}: {tokens_per_s(record):.2f} tok/s", flush=True)  # fmt: skip
                set_adaptive(urls["speculative"], True)
                print(table(records, [c]), flush=True)
    result = table(records, args.concurrency)
    (args.out / "table.md").write_text(result + "\n")
    print(result)


if __name__ == "__main__":
    main()
