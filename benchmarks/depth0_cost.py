"""What a depth-0 step of adaptive speculation costs against a plain decode step.

Two servers side by side (plain decoding; the same target with its draft and
`--nanospec-adaptive`, pinned live to depth 0 with `{"adaptive_depth": 0}`), one batch
of ``b`` greedy requests to each in turn (the order alternating), ``--rounds`` times, for
each batch size. A step's wall time is read the same way on both: the client-side interval
between successive streamed chunks of a request while the whole batch decodes (one token
per request per step on both servers), median over requests and steps. Per batch size:
the median ratio over rounds and its bootstrap 95% interval. ``--sessions N`` splits the
rounds among N pairs of freshly started servers (the start order alternating by pair), so
that the interval holds the draw of the server processes too: one pair's rounds share
one draw, which on a 2-core host moves a server's step time by several percent. The
adaptive server's own `/stats/vocab` step timings (``adaptive.recent_steps``) and the
path its steps took are printed beside it. Each server runs in the dtype `nanospec serve`
picks on the host.

    python benchmarks/depth0_cost.py --pair default --rounds 10   # 1.5B + STANDALONE 0.5B
    python benchmarks/depth0_cost.py --pair eagle --rounds 10     # 0.5B + its EAGLE head
    python benchmarks/depth0_cost.py --pair eagle --rounds 12 --sessions 3   # three pairs
    # SGLang's depth-0 step (a one-node verify) against plain decoding, for comparison:
    python benchmarks/depth0_cost.py --pair eagle --adaptive-flags \
        --nanospec-adaptive-verify-depth-0
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
from bootstrap import bootstrap_median

from nanospec_server.bench.cli import shipped_eagle_head
from nanospec_server.bench.specbench import first_turns
from nanospec_server.launch.server import running_servers, speculative_flags
from nanospec_server.models.defaults import default_serve_argv
from nanospec_server.models.paths import model_paths

PAIRS = {  # the adaptive server's flags; the plain server serves its first two (the target)
    "default": lambda: default_serve_argv() + ["--nanospec-prior-k", "2048"],
    "eagle": lambda: (
        ["--model-path", str(model_paths("qwen2.5-coder-0.5b-instruct").hf_dir)]
        + speculative_flags("EAGLE", str(shipped_eagle_head()), 4, 1, 5)
    ),
}


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


def path_counts(stats: dict, b: int) -> str:
    paths: dict[str, int] = {}
    for step in stats["adaptive"]["recent_steps"]:
        if step["batch_size"] == b and step["depth"] == 0:
            paths[step["path"]] = paths.get(step["path"], 0) + 1
    return ", ".join(f"{n} {p}" for p, n in sorted(paths.items())) or "none"


def session_ratios(
    servers: dict[str, tuple[list[str], Path]],
    args: argparse.Namespace,
    rounds: int,
    admin_key: str,
) -> dict[int, list[float]]:
    """One pair of fresh servers: per batch size, the depth-0 / plain ratio of each of
    its ``rounds`` rounds."""
    ratios: dict[int, list[float]] = {b: [] for b in args.batch_sizes}
    with running_servers(servers, one_at_a_time=True) as urls:
        set_settings(urls["depth0"], admin_key, {"adaptive_depth": 0})
        texts = prompts(max(args.batch_sizes))
        print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
        for b in args.batch_sizes:
            for round_ in range(rounds):
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
                    f"(server's own depth-0 step_ms median {own_ms:.1f}; {path_counts(stats, b)})",
                    flush=True,
                )
                ratios[b].append(ms["depth0"] / ms["plain"])
        print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", choices=sorted(PAIRS), default="eagle")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument(
        "--sessions", type=int, default=1, help="fresh server pairs the rounds are split among"
    )
    parser.add_argument("--adaptive-flags", nargs=argparse.REMAINDER, default=[])
    args = parser.parse_args()
    if args.sessions < 1 or args.rounds % args.sessions:
        parser.error("--sessions: a positive divisor of --rounds")
    rounds = args.rounds // args.sessions  # per pair of servers

    admin_key = "depth0-cost-admin-key-0123456789"
    spec = PAIRS[args.pair]()
    limits = ["--max-total-tokens", "16384", "--admin-api-key", admin_key]
    plain = spec[:2] + limits  # the target alone
    adaptive = spec + limits + ["--nanospec-adaptive", *args.adaptive_flags]
    print(" ".join(["adaptive:", *adaptive]), flush=True)
    ratios: dict[int, list[float]] = {b: [] for b in args.batch_sizes}
    for session in range(args.sessions):
        logs = Path(tempfile.mkdtemp(prefix=f"depth0-cost-{session}-"))
        servers = {"plain": (plain, logs / "plain.log"), "depth0": (adaptive, logs / "a.log")}
        if session % 2:  # the server started second may land differently in memory
            servers = dict(reversed(servers.items()))
        print(f"session {session}: {' then '.join(servers)}", flush=True)
        for b, session_ratios_b in session_ratios(servers, args, rounds, admin_key).items():
            ratios[b] += session_ratios_b
    for b in args.batch_sizes:
        median, low, high = bootstrap_median(ratios[b])
        print(
            f"b={b:2d}: depth-0 / plain median {median:.3f} over {len(ratios[b])} rounds "
            f"({args.sessions} server pairs), 95% interval [{low:.3f}, {high:.3f}]",
            flush=True,
        )


if __name__ == "__main__":
    main()
