"""What a depth-0 step of adaptive speculation costs against a plain decode step.

Two servers side by side (plain decoding; the same target with a speculative draft and
`--nanospec-adaptive`, pinned live to depth 0 with `{"adaptive_depth": 0}`), one batch
of ``b`` greedy requests to each in turn, ``--rounds`` times, for each batch size. A step's
wall time is read the same way on both: the client-side interval between successive
streamed chunks of a request while the whole batch decodes (one token per request per
step on both servers), median over requests and steps. The adaptive server's own
`/stats/vocab` step timings (``adaptive.recent_steps``) are printed beside it.

    python benchmarks/depth0_cost.py --target qwen2.5-coder-0.5b-instruct \\
        --eagle nanospec_server/models/heads/qwen2.5-coder-0.5b-instruct-eagle --shape 4,4,8

Extra flags for the adaptive server go after ``--adaptive-flags`` (e.g. skip the extend).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from nanospec_server.bench.specbench import first_turns
from nanospec_server.launch.server import running_servers, speculative_flags
from nanospec_server.models.paths import model_paths


def prompts(count: int) -> list[str]:
    """Spec-Bench first turns, one per category in turn, cut short (prefill is not timed)."""
    return [text[:400] for text in first_turns(count)]


def stream_times(url: str, text: str, max_new: int) -> list[float]:
    body = {
        "text": text,
        "stream": True,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True},
    }
    times = []
    with requests.post(f"{url}/generate", json=body, stream=True, timeout=3600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith(b"data: {"):
                times.append(time.perf_counter())
    return times


def batch_step_ms(url: str, texts: list[str], max_new: int) -> float:
    """Median interval between a request's chunks while every request of the batch is
    between its first and last chunk (all decoding)."""
    with ThreadPoolExecutor(len(texts)) as pool:
        runs = list(pool.map(lambda t: stream_times(url, t, max_new), texts))
    start = max(r[0] for r in runs)  # every request has prefilled
    end = min(r[-1] for r in runs)  # none has finished
    gaps = [b - a for r in runs for a, b in zip(r, r[1:], strict=False) if a >= start and b <= end]
    return 1000 * statistics.median(gaps) if gaps else float("nan")


def set_settings(url: str, admin_key: str, changes: dict) -> None:
    response = requests.post(
        f"{url}/nanospec/settings", json=changes, headers={"X-Admin-Key": admin_key}, timeout=60
    )
    response.raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--eagle", help="an EAGLE head directory (else --standalone)")
    parser.add_argument("--standalone", help="a STANDALONE draft model")
    parser.add_argument("--shape", default="4,4,8")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--adaptive-flags", nargs=argparse.REMAINDER, default=[])
    args = parser.parse_args()

    def resolve(name: str) -> Path:  # a registry name, or a path
        return Path(name) if Path(name).exists() else model_paths(name).hf_dir

    target = resolve(args.target)
    steps, topk, tokens = (int(x) for x in args.shape.split(","))
    algorithm, draft = ("EAGLE", args.eagle) if args.eagle else ("STANDALONE", args.standalone)
    draft_path = resolve(draft) if algorithm == "STANDALONE" else draft
    admin_key = "depth0-cost-admin-key-0123456789"
    base = ["--model-path", str(target), "--dtype", "float32", "--max-total-tokens", "16384"]
    base += ["--mem-fraction-static", "0.9", "--admin-api-key", admin_key]
    spec = speculative_flags(algorithm, draft_path, steps, topk, tokens)
    spec += ["--nanospec-adaptive", *args.adaptive_flags]
    logs = Path(tempfile.mkdtemp(prefix="depth0-cost-"))
    servers = {"plain": (base, logs / "plain.log"), "depth0": (base + spec, logs / "a.log")}
    with running_servers(servers) as urls:
        set_settings(urls["depth0"], admin_key, {"adaptive_depth": 0})
        texts = prompts(max(args.batch_sizes))
        print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
        for b in args.batch_sizes:
            ratios = []
            for round_ in range(args.rounds):
                order = ["plain", "depth0"] if round_ % 2 == 0 else ["depth0", "plain"]
                ms = {
                    name: batch_step_ms(urls[name], texts[:b], args.max_new_tokens)
                    for name in order
                }
                stats = requests.get(f"{urls['depth0']}/stats/vocab", timeout=60).json()
                own = [
                    s["step_ms"]
                    for s in stats["adaptive"]["recent_steps"]
                    if s["batch_size"] == b and s["depth"] == 0
                ]
                own_ms = statistics.median(own) if own else float("nan")
                print(
                    f"b={b:2d} round {round_}: plain {ms['plain']:8.1f} ms/step  depth-0 "
                    f"{ms['depth0']:8.1f} ms/step  ratio {ms['depth0'] / ms['plain']:.3f}  "
                    f"(server's own depth-0 step_ms median {own_ms:.1f})",
                    flush=True,
                )
                ratios.append(ms["depth0"] / ms["plain"])
            print(
                f"b={b:2d}: median ratio over {args.rounds} rounds {statistics.median(ratios):.3f}"
            )
        print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
