"""Plain decoding with and without SGLang's overlap loop under streamed load, side by side.

A speculative server on a CPU runs SGLang's normal (non-overlap) event loop ("Overlap
schedule is not implemented for speculative decoding on CPU"), plain decoding the overlap
loop. This puts a number on that difference alone: the same target served twice as plain
decoding, once as SGLang starts it and once with ``--disable-overlap-schedule``, both up at
once, each round's batch of c Spec-Bench first turns (streamed, greedy) sent to each in
turn, the order alternating; per c the median ratio (normal loop over overlap loop) of the
rounds' throughputs with its bootstrap interval.

    python benchmarks/overlap_streamed.py --pair eagle --rounds 4 --concurrency 8 16 --seed 211
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bootstrap import bootstrap_median
from load_table import PAIRS, prompt_ids, run_batch, tokens_per_s, without_flag

from nanospec_server.launch.server import running_servers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="eagle")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    target = without_flag(PAIRS[args.pair](), "--max-total-tokens")[:2]
    target += ["--max-total-tokens", "16384"]
    logs = Path(tempfile.mkdtemp(prefix="overlap-"))
    servers = {
        "overlap": (target, logs / "overlap.log"),
        "normal": (target + ["--disable-overlap-schedule"], logs / "normal.log"),
    }
    prompts = prompt_ids(target[1], sum(args.concurrency) * args.rounds, args.seed)
    with running_servers(servers, one_at_a_time=True) as urls:
        for url in urls.values():  # a first request pays one-time costs outside the table
            run_batch(url, prompts[:1], 8)
        start = 0
        for c in args.concurrency:
            ratios = []
            for round_ in range(args.rounds):
                batch, start = prompts[start : start + c], start + c
                order = ["overlap", "normal"] if round_ % 2 == 0 else ["normal", "overlap"]
                speed = {name: tokens_per_s(run_batch(urls[name], batch, args.max_new_tokens)) for name in order}  # fmt: skip
                ratios.append(speed["normal"] / speed["overlap"])
                print(f"c={c} round {round_}: overlap {speed['overlap']:.2f} tok/s, normal {speed['normal']:.2f} tok/s, {ratios[-1]:.3f}", flush=True)  # fmt: skip
            median, low, high = bootstrap_median(ratios)
            rounds = ", ".join(f"{r:.3f}" for r in ratios)
            print(
                f"c={c}: normal loop / overlap loop {median:.3f} [{low:.3f}-{high:.3f}] ({rounds})"
            )


if __name__ == "__main__":
    main()
