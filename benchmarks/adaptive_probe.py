"""One batch size under the adaptive policy: what it chose and what each step cost.

Plain decoding and `--nanospec-adaptive` side by side (one server of each, started one at a
time), on the benchmark's prompts: two warm-up batches of 4 (the policy's cold start), then
``--rounds`` batches of every prompt sent together to each server in turn (wall time and
median latency), then the adaptive server's own `/stats/vocab.adaptive`: the steps per depth
and batch size, the prefills without top-K_pre, the cost model, and the last steps with
their batch size, depth, reason and wall time.

    python benchmarks/adaptive_probe.py --pair eagle        # 0.5B target + EAGLE head, fp32
    python benchmarks/adaptive_probe.py --pair standalone   # the default pair, bf16
    python benchmarks/adaptive_probe.py --pair standalone --pin-depth 0   # its depth-0 ceiling

``--write-calibration PATH`` saves the adaptive server's cost model at the end (what
`nanospec serve --nanospec-adaptive-calibration PATH` starts from on this host, with the
same models, dtype and flags: those of ``--pair``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from transformers import AutoTokenizer

from nanospec_server.adaptive.calibration import Calibration, write_calibration
from nanospec_server.admin.auth import ADMIN_KEY_HEADER
from nanospec_server.bench.cli import shipped_eagle_head
from nanospec_server.bench.data import load_tasks
from nanospec_server.launch.server import generate, running_servers, speculative_flags
from nanospec_server.models.chat import encode_chat
from nanospec_server.models.paths import model_paths

ADMIN_KEY = "adaptive-probe-admin-key-0123456789"
PAIRS = {  # target, dtype, speculative flags
    "eagle": ("qwen2.5-coder-0.5b-instruct", "float32",
              lambda: speculative_flags("EAGLE", str(shipped_eagle_head()), 4, 1, 5)),
    "standalone": ("qwen2.5-coder-1.5b-instruct", "bfloat16",
                   lambda: speculative_flags("STANDALONE", str(model_paths(
                       "qwen2.5-coder-0.5b-instruct").hf_dir), 4, 1, 5) + ["--nanospec-prior-k", "2048"]),
}  # fmt: skip


def batch_seconds(url: str, prompts: list[list[int]], max_new: int) -> tuple[float, float]:
    """(wall time of the batch, median request latency)."""

    def one(input_ids: list[int]) -> float:
        start = time.perf_counter()
        generate(url, input_ids, max_new)
        return time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        latencies = list(pool.map(one, prompts))
    return time.perf_counter() - start, statistics.median(latencies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="eagle")
    parser.add_argument("--tasks", nargs="+", default=["translation", "qa", "math", "code"])
    parser.add_argument("--limit-per-task", type=int, default=4)
    parser.add_argument("--seed", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--log-dir", type=Path, default=Path("adaptive-probe-logs"))
    parser.add_argument(
        "--pin-depth", type=int, help="pin the adaptive server to this depth (its ceiling there)"
    )
    parser.add_argument(
        "--write-calibration", type=Path, metavar="PATH",
        help="save the adaptive server's cost model for --nanospec-adaptive-calibration",
    )  # fmt: skip
    args = parser.parse_args()
    if args.write_calibration is not None and args.pin_depth is not None:
        parser.error("--write-calibration: not with --pin-depth (one depth is all it would time)")

    name, dtype, spec = PAIRS[args.pair]
    target = model_paths(name).hf_dir
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    picked = load_tasks(None, args.limit_per_task, args.seed, tuple(args.tasks))
    prompts = [encode_chat(tokenizer, p.turns[:1], []) for p in picked]
    print(f"{len(prompts)} prompts, {sum(map(len, prompts))} prompt tokens")
    base = ["--model-path", str(target), "--dtype", dtype, "--max-total-tokens", "8192"]
    base += ["--mem-fraction-static", "0.9", "--admin-api-key", ADMIN_KEY]
    args.log_dir.mkdir(parents=True, exist_ok=True)
    servers = {
        "plain": (base, args.log_dir / "plain.log"),
        "adaptive": (base + spec() + ["--nanospec-adaptive"], args.log_dir / "adaptive.log"),
    }
    with running_servers(servers, one_at_a_time=True) as urls:
        if args.pin_depth is not None:
            pin = {"adaptive_depth": args.pin_depth}
            headers = {ADMIN_KEY_HEADER: ADMIN_KEY}
            url = f"{urls['adaptive']}/nanospec/settings"
            requests.post(url, json=pin, headers=headers, timeout=60).raise_for_status()
        for url in urls.values():
            batch_seconds(url, prompts[:4], args.max_new_tokens)
            batch_seconds(url, prompts[4:8], args.max_new_tokens)
        for round_ in range(args.rounds):
            for server in ["plain", "adaptive"][:: 1 if round_ % 2 == 0 else -1]:
                wall, median = batch_seconds(urls[server], prompts, args.max_new_tokens)
                print(f"round {round_} {server}: wall {wall:.2f} s, median latency {median:.2f} s")
        stats = requests.get(f"{urls['adaptive']}/stats/vocab", timeout=60).json()["adaptive"]
    steps = stats.pop("recent_steps")
    calibration = stats.pop("calibration")
    if args.write_calibration is not None:
        if calibration is None:
            raise SystemExit("--write-calibration: the cost model is not ready; run more rounds")
        write_calibration(Calibration.model_validate(calibration), args.write_calibration)
        print(f"calibration: {args.write_calibration}")
    print(json.dumps(stats, indent=1))
    print("last steps (batch size, depth, reason, ms):")
    print([(s["batch_size"], s["depth"], s["reason"], s["step_ms"]) for s in steps])


if __name__ == "__main__":
    main()
