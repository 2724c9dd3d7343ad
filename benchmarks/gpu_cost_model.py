"""GPU cost model of the packed draft head, from candidate streams recorded on real runs.

A GPU serves batches this machine cannot, so this replays streams recorded from the real
pair (Spec-Bench prompts) through the vocabulary state at batch 1, 8, 32, 128, as the
server would on CUDA (one vocabulary slot per running request, the default union
capacity), and reports per step: the union size (rows the packed head reads), bytes the
packed head reads against the full head at a GPU-sized draft head, bytes the gather moves
(entering rows), and the state's memory. The LM head of a decode step is memory-bound on
a GPU, so bytes read are its cost.

    # 1. record (starts the real default pair on CPU, a few minutes):
    python benchmarks/gpu_cost_model.py record --prompts 16 --max-new-tokens 32 --budget-s 600
    # 2. replay (seconds to minutes):
    python benchmarks/gpu_cost_model.py replay --hidden 4096 --vocab 152064

Recordings go to ~/.cache/nanospec-server/streams/ (outside the repo).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import torch

from nanospec_server.vocab import DynamicVocab

DEFAULT_STREAMS = Path.home() / ".cache/nanospec-server/streams/specbench.jsonl"


def record(args: argparse.Namespace) -> int:
    from nanospec_server.bench.specbench import spec_bench_prompts
    from nanospec_server.env import RECORD_STREAMS
    from nanospec_server.launch import server
    from nanospec_server.launch.server import generate, running_server
    from nanospec_server.models.defaults import default_serve_argv

    args.streams.parent.mkdir(parents=True, exist_ok=True)
    args.streams.unlink(missing_ok=True)
    flags = default_serve_argv() + ["--max-total-tokens", "16384"]
    target = Path(flags[flags.index("--model-path") + 1])
    prompts = spec_bench_prompts(target, args.prompts)
    os.environ[RECORD_STREAMS] = str(args.streams)  # the server's scheduler inherits it
    server.START_TIMEOUT_S = args.start_timeout  # a loaded CPU host loads slowly
    log = Path(tempfile.mkdtemp()) / "record.log"
    print(f"server log: {log}")
    with running_server(flags, log) as url:
        pool = ThreadPoolExecutor(args.concurrency)
        futures = [pool.submit(generate, url, p, args.max_new_tokens) for p in prompts]
        # Past the budget, stop: requests still running keep the steps recorded so far.
        done, _ = wait(futures, timeout=args.budget_s)
        pool.shutdown(wait=False, cancel_futures=True)
    print(f"{len(done)} of {len(prompts)} requests finished -> {args.streams}")
    return 0


def load_streams(path: Path) -> list[list[list[int]]]:
    """Per request: its appends in order, both prefill appends merged into the first."""
    events: dict[str, list[list[int]]] = defaultdict(list)
    decoding: set[str] = set()
    for line in path.read_text().splitlines():
        row = json.loads(line)
        steps = events[row["rid"]]
        if row["kind"] == "prefill" and steps and row["rid"] not in decoding:
            steps[0] = steps[0] + row["tokens"]  # chunked prefill: one first append
        else:
            steps.append(row["tokens"])
            if row["kind"] == "step":
                decoding.add(row["rid"])
    return [steps for steps in events.values() if len(steps) > 1]


def replay(streams, batch: int, args: argparse.Namespace) -> dict:
    """``batch`` requests at a time (a finished one is replaced by the next stream); with
    fewer recorded streams than ``batch``, streams repeat (their tokens coincide, so the
    union is then a lower bound). Statistics cover decode steps with ``batch`` requests."""
    vocab_size, w = args.vocab, args.w_max
    # A narrow weight stands in for the head: bytes are computed for the real width.
    weight = torch.zeros(vocab_size, 1)
    vocab = DynamicVocab(
        weight, num_slots=batch + 1, w_cap=w, w_max=w, always_active=args.eos,
        max_batch=batch, union_capacity=args.union_capacity,
    )  # fmt: skip
    row_bytes = args.hidden * args.dtype_bytes
    queue = [streams[i % len(streams)] for i in range(max(batch, len(streams)))]
    running: dict[int, list[list[int]]] = {}  # slot -> remaining appends
    union, entered, summed, steps = [], [], [], 0
    while queue or running:
        prefill = False  # a step that admits a request is a prefill: not a decode step
        for slot in range(1, batch + 1):
            if slot not in running and queue:
                running[slot] = list(queue.pop(0))
                vocab.reset(torch.tensor([slot]))
                prefill = True
        slots = sorted(running)
        appends = [running[s].pop(0) for s in slots]
        width = max(len(a) for a in appends)
        tokens = torch.zeros(len(slots), width, dtype=torch.int64)
        valid = torch.zeros(len(slots), width, dtype=torch.bool)
        for i, a in enumerate(appends):
            tokens[i, : len(a)] = torch.tensor(a, dtype=torch.int64)
            valid[i, : len(a)] = True
        before = set(vocab.head.ids[: int(vocab.head.count)].tolist())
        vocab.append(torch.tensor(slots), tokens, valid)
        vocab.refresh(torch.tensor(slots))
        live = vocab.head.ids[: int(vocab.head.count)].tolist()
        if len(slots) == batch and not prefill:  # full decode steps of this batch size
            union.append(len(live))
            entered.append(len(set(live) - before))
            summed.append(int(vocab.active_size(torch.tensor(slots)).sum()))
            steps += 1
        for s in [s for s in slots if not running[s]]:
            del running[s]
    memory = vocab.memory_report()
    capacity = vocab.head.capacity
    union_bytes = (capacity + 1) * (row_bytes + 8) + (vocab_size + 1) * 20
    return {
        "batch": batch,
        "steps": steps,
        "union_mean": statistics.fmean(union),
        "union_max": max(union),
        "sum_sets": statistics.fmean(summed),
        "distinct": min(batch, len(streams)),
        "capacity": capacity,
        "packed_read_mb": statistics.fmean(union) * row_bytes / 2**20,
        "full_read_mb": vocab_size * row_bytes / 2**20,
        "gather_mb": statistics.fmean(entered) * row_bytes * 2 / 2**20,  # read + write
        "state_mb": (memory["window_bytes"] + union_bytes) / 2**20,
        "not_admitted": vocab.overflow_stats()["tokens_not_admitted"],
        "overflow_steps": vocab.overflow_stats()["overflows"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record", help="record candidate streams from the real pair")
    rec.add_argument("--prompts", type=int, default=32)
    rec.add_argument("--max-new-tokens", type=int, default=32)
    rec.add_argument("--concurrency", type=int, default=4)
    rec.add_argument("--start-timeout", type=int, default=1200, help="seconds")
    rec.add_argument("--budget-s", type=int, default=600, help="stop recording after this")
    rec.add_argument("--streams", type=Path, default=DEFAULT_STREAMS)
    rep = commands.add_parser("replay", help="replay recorded streams at several batch sizes")
    rep.add_argument("--streams", type=Path, default=DEFAULT_STREAMS)
    rep.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    rep.add_argument("--vocab", type=int, default=151936, help="rows of the draft head")
    rep.add_argument("--hidden", type=int, default=4096, help="draft head width on the GPU")
    rep.add_argument("--dtype-bytes", type=int, default=2)
    rep.add_argument("--w-max", type=int, default=3072)
    rep.add_argument("--eos", type=int, nargs="*", default=[151643, 151645])
    rep.add_argument("--union-capacity", type=int, default=None)
    args = parser.parse_args()
    if args.command == "record":
        return record(args)
    if not args.streams.is_file():
        parser.error(f"--streams: no recording at {args.streams} (run `record` first)")
    streams = load_streams(args.streams)
    print(f"command: {' '.join(sys.argv)}")
    print(f"{len(streams)} recorded requests, {sum(len(s) - 1 for s in streams)} decode steps;"
          f" head d={args.hidden}, V={args.vocab}, {8 * args.dtype_bytes}-bit, W_max={args.w_max}")  # fmt: skip
    header = (
        f"{'batch':>5}{'distinct':>9}{'steps':>6}{'union':>7}{'max':>6}{'sum|I|':>8}{'cap':>7}"
        f"{'packed MB':>10}{'full MB':>9}{'full/packed':>12}{'gather MB':>10}{'state MB':>9}"
        f"{'not adm.':>9}"
    )
    print(header)
    for batch in args.batches:
        r = replay(streams, batch, args)
        print(
            f"{r['batch']:>5}{r['distinct']:>9}{r['steps']:>6}{r['union_mean']:>7.0f}"
            f"{r['union_max']:>6}{r['sum_sets']:>8.0f}{r['capacity']:>7}"
            f"{r['packed_read_mb']:>10.1f}{r['full_read_mb']:>9.1f}"
            f"{r['full_read_mb'] / r['packed_read_mb']:>11.1f}x{r['gather_mb']:>10.2f}"
            f"{r['state_mb']:>9.1f}{r['not_admitted']:>9}"
        )
    print(
        "union: rows the packed head reads (mean per decode step); sum|I|: the sum of the "
        "requests' own sets (what per-request buffers would read; min(V, sum|I|) bounds the "
        "union from above where streams repeat, distinct < batch)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
