"""The long soak: ~1,000 requests against a tiny NanoSpec server, then its verdict.

    python benchmarks/soak.py --requests 1000 --output soak.json

Starts a tiny NanoSpec server (tiny target, tiny EAGLE draft) and a plain one, takes plain
decoding's greedy outputs, then sends the requests (random lengths, streamed and not,
~25% cut short by a leaving client or /abort_request, some sampled, some with their own
W_max) from `--concurrency` clients while W_max changes live. Checks: the scheduler's RSS
grows by less than `soak_checks.RSS_GROWTH_BOUND_MB` after warm-up, nothing is held at the
end, the statistics add up, and every greedy output is plain decoding's. Exits 1 on any
failure; sending stops at `--time-cap-s` (a failure too: fewer requests went out).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from nanospec_server.bench.soak import W_CAP, soak_with_servers
from nanospec_server.bench.soak_plan import plan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-prompt", type=int, default=300, help="longest prompt, tokens")
    parser.add_argument("--max-new", type=int, default=48, help="most new tokens a request asks")
    parser.add_argument("--w-max-interval-s", type=float, default=2.0, help="between changes")
    parser.add_argument("--time-cap-s", type=float, default=1500, help="stop sending after")
    parser.add_argument("--warmup", type=int, default=None, help="default: a tenth of requests")
    parser.add_argument("--output", type=Path, default=None, help="write the verdict as JSON")
    parser.add_argument("--log-dir", type=Path, default=None, help="server logs (default: tmp)")
    args = parser.parse_args()
    jobs = plan(args.requests, args.seed, args.max_prompt, args.max_new, W_CAP)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="nanospec-soak-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    verdict = soak_with_servers(
        jobs,
        log_dir,
        concurrency=args.concurrency,
        w_max_interval_s=args.w_max_interval_s,
        deadline_s=args.time_cap_s,
        warmup=args.warmup or max(1, args.requests // 10),
    )
    summary = verdict.summary() | {"command": sys.argv, "server_logs": str(log_dir)}
    text = json.dumps(summary, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text + "\n")
    return 1 if verdict.failures else 0


if __name__ == "__main__":
    sys.exit(main())
