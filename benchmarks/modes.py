"""Acceptance, coverage and draft-head size per NanoSpec mode, side by side in one run.

Starts one `nanospec serve` per mode on the same target/draft and prompts, sends every
prompt greedily, and reports per mode: mean acceptance length, coverage, active
vocabulary, LM-head rows per draft call, tokens/s, and each against `full`.

    python benchmarks/modes.py --tiny                          # tiny offline models (minutes)
    python benchmarks/modes.py --prompts 10 --max-new-tokens 64   # the real default pair
    python benchmarks/modes.py --modes full nanospec --json out.json

Real-model prompts are the first turns of Spec-Bench (../shared/data/specbench), read by
path and formatted with the target's chat template.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from nanospec_server.bench.server import generate, running_server, speculative_flags
from nanospec_server.bench.specbench import spec_bench_prompts
from nanospec_server.config import Mode


def tiny_setup(count: int) -> tuple[list[str], list[list[int]]]:
    """The agree pair (its draft predicts the context-free target exactly): half the prompts
    hold their own continuation (a chain of the target's successors, then its first token
    again), half are random, so the modes differ only in what their vocabularies hold."""
    from nanospec_server.models.tiny import tiny_model_path
    from nanospec_server.models.tiny.tokenizer import BOS_ID, VOCAB_SIZE
    from nanospec_server.models.tiny.weights import SEEDS, agree_successor

    successor = agree_successor(VOCAB_SIZE, SEEDS["agree-target"])[0].tolist()
    rng = random.Random(0)
    prompts = []
    for i in range(count):
        start = rng.randrange(3, VOCAB_SIZE)
        if i % 2 == 0:
            chain = [start]
            while len(chain) < 80:
                chain.append(successor[chain[-1]])
            prompts.append([BOS_ID, *chain, start])
        else:
            prompts.append([BOS_ID] + [rng.randrange(3, VOCAB_SIZE) for _ in range(80)])
    flags = ["--model-path", str(tiny_model_path("agree-target")), "--max-total-tokens", "16384"]
    return flags + speculative_flags("EAGLE", "agree-eagle", 3, 1, 4), prompts


def real_setup(count: int) -> tuple[list[str], list[list[int]]]:
    from nanospec_server.models.defaults import default_serve_argv

    flags = default_serve_argv() + ["--max-total-tokens", "16384"]
    target = Path(flags[flags.index("--model-path") + 1])
    return flags, spec_bench_prompts(target, count)


def run_mode(mode: str, flags: list[str], prompts: list[list[int]], max_new: int, w_max: int):
    mode_flags = ["--nanospec-mode", mode, "--nanospec-w-max", str(w_max)]
    if mode == Mode.STATIC.value:
        mode_flags += ["--speculative-token-map", str(static_token_map(flags))]
    log = Path(tempfile.mkdtemp()) / f"{mode}.log"
    with running_server(flags + mode_flags, log) as url:
        start = time.perf_counter()
        results = [generate(url, prompt, max_new) for prompt in prompts]
        elapsed = time.perf_counter() - start
    stats = [r["meta_info"]["nanospec"][-1] for r in results]
    tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
    mean = lambda key: statistics.fmean(s[key] for s in stats if s[key] is not None)  # noqa: E731
    return {
        "mode": mode,
        "accept_length": mean("accept_length_mean"),
        "coverage": mean("coverage"),
        "active_vocab": mean("active_vocab_mean"),
        "head_rows": mean("lm_head_rows_mean"),
        "vocab_size": stats[0]["vocab_size"],
        "tokens_per_s": tokens / elapsed,
        "outputs": [r["output_ids"] for r in results],
    }


def static_token_map(flags: list[str]) -> Path:
    """FR-Spec list: top tokens of Python's own standard-library sources (offline)."""
    import sysconfig

    from nanospec_server.models.token_map import build_token_map

    target = Path(flags[flags.index("--model-path") + 1])
    path = Path(tempfile.mkdtemp()) / "token_map.pt"
    stdlib = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:200]
    vocab = json.loads((target / "config.json").read_text())["vocab_size"]
    build_token_map(target, stdlib, min(32768, vocab // 4), path)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny offline models")
    parser.add_argument("--modes", nargs="+", default=[m.value for m in Mode])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--w-max", type=int, default=3072)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    unknown = set(args.modes) - {m.value for m in Mode}
    if unknown:
        parser.error(f"--modes: unknown {sorted(unknown)}")
    flags, prompts = (tiny_setup if args.tiny else real_setup)(args.prompts)
    rows = [run_mode(m, flags, prompts, args.max_new_tokens, args.w_max) for m in args.modes]
    base = next((r for r in rows if r["mode"] == "full"), rows[0])
    print(f"command: {' '.join(sys.argv)}")
    print(f"{'mode':<10}{'accept':>8}{'coverage':>10}{'|I|':>8}{'rows':>9}{'rows/V':>8}"
          f"{'tok/s':>8}{'vs full':>9}  lossless")  # fmt: skip
    for r in rows:
        same = r["outputs"] == base["outputs"]
        print(f"{r['mode']:<10}{r['accept_length']:>8.2f}{r['coverage']:>10.3f}"
              f"{r['active_vocab']:>8.0f}{r['head_rows']:>9.0f}{r['head_rows'] / r['vocab_size']:>8.4f}"
              f"{r['tokens_per_s']:>8.2f}{r['tokens_per_s'] / base['tokens_per_s']:>8.2f}x  {same}")  # fmt: skip
    if args.json:
        args.json.write_text(
            json.dumps([{k: v for k, v in r.items() if k != "outputs"} for r in rows], indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
