"""Server configurations side by side under SGLang's own load client.

Each configuration of a preset is started alone in turn (two real servers may not fit in
memory together), driven by `sglang.bench_serving` (random token ids) at each concurrency,
and stopped; ``--rounds`` rounds interleave them, the order reversed every other round.
Prints every run's output tokens per second and inter-token latency (median, P99), then each
configuration's median ratio to the preset's first one per concurrency.

Presets:
- ``overlap``: plain decoding of the default target with and without SGLang's overlap
  schedule (on a CPU torch's streams and events do nothing: does the loop matter?).
- ``bf16-linear``: in bf16, SGLang's own linear layers (``NANOSPEC_CPU_LINEAR=0``)
  against our packed row-invariant ones, for plain decoding and the default pair.
- ``memory``: plain decoding as the CPU path starts it (the scheduler's malloc keeping
  what it frees, `sglang_plugin/cpu/heap.py`), with glibc's own malloc thresholds
  (``NANOSPEC_CPU_KEEP_FREED=0``), and with torch's CPU allocator asking for transparent
  huge pages (``THP_MEM_ALLOC_ENABLE=1``).
- ``serve``: plain decoding of the default target beside `nanospec serve`'s default pair
  as it starts with no flags (adaptive speculation on, on a CPU).

    python benchmarks/load_ab.py overlap --rounds 2 --concurrency 8
    python benchmarks/load_ab.py bf16-linear --rounds 2 --concurrency 1 8
    python benchmarks/load_ab.py memory --rounds 3 --concurrency 1 8
    python benchmarks/load_ab.py serve --rounds 2 --concurrency 8 16

``--stats DIR`` keeps each run's `/stats/vocab` (the depths the policy chose, and why).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import requests

from nanospec_server.env import CPU_KEEP_FREED, CPU_LINEAR
from nanospec_server.launch.server import running_server
from nanospec_server.models.defaults import DEFAULT_CPU_PRIOR_K, default_serve_argv


@dataclass(frozen=True)
class Config:
    flags: list[str]
    env: dict[str, str] = field(default_factory=dict)


def presets() -> dict[str, dict[str, Config]]:
    pair = default_serve_argv()  # the embedded default: target, draft and memory flags
    plain = pair[:2] + ["--max-total-tokens", "16384"]
    bf16 = ["--dtype", "bfloat16"]
    return {
        "overlap": {
            "overlap": Config(plain),
            "no-overlap": Config(plain + ["--disable-overlap-schedule"]),
        },
        "bf16-linear": {
            "plain-sglang-linear": Config(plain + bf16, {CPU_LINEAR: "0"}),
            "plain-packed": Config(plain + bf16),
            "pair-sglang-linear": Config(pair + bf16, {CPU_LINEAR: "0"}),
            "pair-packed": Config(pair + bf16),
        },
        "memory": {
            "plain": Config(plain),
            "glibc-malloc": Config(plain, {CPU_KEEP_FREED: "0"}),
            "thp": Config(plain, {"THP_MEM_ALLOC_ENABLE": "1"}),
        },
        "serve": {
            "plain": Config(plain),
            "nanospec-serve": Config(pair + ["--nanospec-prior-k", str(DEFAULT_CPU_PRIOR_K)]),
        },
    }


def bench_serving(url: str, tokenizer: str, concurrency: int, args, out: Path) -> dict:
    command = [
        sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--base-url", url,
        "--tokenizer", tokenizer, "--dataset-name", "random-ids",
        "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
        "--num-prompts", str(args.prompts_per_slot * concurrency),
        "--max-concurrency", str(concurrency), "--seed", str(args.seed), "--output-file", str(out),
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(out.read_text().splitlines()[-1])


def save_stats(url: str, path: Path) -> None:
    """The server's `/stats/vocab` now (a plain server has none: nothing is written)."""
    response = requests.get(f"{url}/stats/vocab", timeout=30)
    if response.status_code == 200:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(response.text)


@contextmanager
def run_config(config: Config, log: Path) -> Iterator[str]:
    """`running_server` with the configuration's environment (its processes inherit it)."""
    saved = {key: os.environ.get(key) for key in config.env}
    os.environ.update(config.env)
    try:
        with running_server(config.flags, log) as url:
            yield url
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("preset", choices=("overlap", "bf16-linear", "memory", "serve"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8])
    parser.add_argument("--prompts-per-slot", type=int, default=2, help="prompts = this x c")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--stats", type=Path, help="a folder for each run's /stats/vocab (what the policy did)"
    )
    args = parser.parse_args()

    configs = presets()[args.preset]
    speed: dict[tuple[str, int], list[float]] = defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            # Odd rounds run the configurations in reverse: a host that slows over the run
            # does not always weigh on the same one.
            for name, config in list(configs.items())[:: 1 if round_ % 2 == 0 else -1]:
                tokenizer = config.flags[config.flags.index("--model-path") + 1]
                with run_config(config, Path(tmp) / f"{name}.log") as url:
                    for concurrency in args.concurrency:
                        out = Path(tmp) / f"{name}-{round_}-{concurrency}.jsonl"
                        report = bench_serving(url, tokenizer, concurrency, args, out)
                        speed[name, concurrency].append(report["output_throughput"])
                        if args.stats is not None:
                            save_stats(url, args.stats / f"{name}-{round_}-{concurrency}.json")
                        print(
                            f"round {round_ + 1} c={concurrency} {name}: "
                            f"{report['output_throughput']:.2f} output tok/s, "
                            f"ITL median {report['median_itl_ms']:.0f} ms, "
                            f"P99 {report['p99_itl_ms']:.0f} ms",
                            flush=True,
                        )
    first = next(iter(configs))
    for concurrency in args.concurrency:
        for name in configs:
            pairs = zip(speed[name, concurrency], speed[first, concurrency], strict=True)
            ratios = [mine / theirs for mine, theirs in pairs]
            print(
                f"c={concurrency} {name} / {first}: {', '.join(f'{r:.3f}' for r in ratios)} "
                f"(median {statistics.median(ratios):.3f})"
            )


if __name__ == "__main__":
    main()
