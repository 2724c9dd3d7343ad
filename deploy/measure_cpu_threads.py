"""Tokens/s of `nanospec serve` on this CPU with the scheduler at 1 thread and at every core.

    OMP_NUM_THREADS=1 python deploy/measure_cpu_threads.py [--tiny] [--max-new-tokens 48] \
        [-- FLAGS FOR nanospec serve]

Starts one server per setting (NANOSPEC_CPU_THREADS), sends the same greedy request
twice (the first warms up), and prints the second's decode rate side by side. Bounded:
one prompt, a few dozen tokens. The default setting in nanospec_server/host.py comes from it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import requests

from nanospec_server.host import CPU_THREADS_ENV, usable_cores
from nanospec_server.launch.server import running_server

PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a docstring."


def tokens_per_second(flags: list[str], threads: int, max_new_tokens: int, log: Path) -> float:
    os.environ[CPU_THREADS_ENV] = str(threads)
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": max_new_tokens,
            "temperature": 0, "ignore_eos": True}}  # fmt: skip
    with running_server(flags, log) as url:
        requests.post(f"{url}/generate", json=body, timeout=1800).raise_for_status()
        start = time.perf_counter()
        answer = requests.post(f"{url}/generate", json=body, timeout=1800).json()
        elapsed = time.perf_counter() - start
    return answer["meta_info"]["completion_tokens"] / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tiny", action="store_true", help="the tiny offline models")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("serve_flags", nargs="*", help="more `nanospec serve` flags, after --")
    args = parser.parse_args()
    flags = (["--tiny"] if args.tiny else []) + args.serve_flags
    cores = usable_cores()
    rates = {}
    with tempfile.TemporaryDirectory() as tmp:
        for threads in sorted({1, cores}):
            log = Path(tmp) / f"threads-{threads}.log"
            rates[threads] = tokens_per_second(flags, threads, args.max_new_tokens, log)
            print(f"scheduler threads {threads}: {rates[threads]:.2f} tokens/s", flush=True)
    print(f"ratio {cores} threads / 1 thread: {rates[cores] / rates[1]:.2f}x")


if __name__ == "__main__":
    main()
