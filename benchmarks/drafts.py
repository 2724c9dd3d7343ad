"""Draft models side by side on one target: acceptance and speed, in one run.

For each draft (EAGLE heads from `nanospec train-eagle`, STANDALONE models) and each
NanoSpec mode, starts `nanospec serve` on the same target, sends the same Spec-Bench
first turns one at a time (greedy), and reports tokens per verification, tokens/s,
the speed-up over plain decoding and whether the output equals plain decoding.

    python benchmarks/drafts.py --eagle nanospec_server/models/heads/qwen2.5-coder-1.5b-instruct-eagle \
        --standalone qwen2.5-coder-0.5b-instruct --modes full nanospec --prompts 10

Tree shapes: `--shape STEPS,TOPK,TOKENS` (repeatable); the default 4,1,5 is a chain of
four draft steps, 4,4,8 a small tree (the paper's EAGLE trees scaled to a CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from nanospec_server.bench.server import generate, running_server, speculative_flags
from nanospec_server.bench.specbench import spec_bench_prompts
from nanospec_server.models.prepare import prepare_model


def _shape(text: str) -> tuple[int, int, int]:
    try:
        steps, topk, tokens = (int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected STEPS,TOPK,TOKENS, got {text!r}") from None
    if min(steps, topk, tokens) < 1:
        raise argparse.ArgumentTypeError(f"all of STEPS,TOPK,TOKENS must be >= 1, got {text!r}")
    return steps, topk, tokens


def _model_dir(name_or_path: str) -> Path:
    path = Path(name_or_path)
    return path if path.is_dir() else prepare_model(name_or_path)


def run_config(name: str, flags: list[str], prompts: list[list[int]], max_new: int) -> dict:
    log = Path(tempfile.mkdtemp()) / "server.log"
    with running_server(flags, log) as url:
        start = time.perf_counter()
        results = [generate(url, prompt, max_new) for prompt in prompts]
        elapsed = time.perf_counter() - start
    tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
    verifies = sum(r["meta_info"].get("spec_verify_ct", 0) for r in results)
    accepted = sum(r["meta_info"].get("spec_accept_length", 0) * r["meta_info"].get("spec_verify_ct", 0) for r in results)  # fmt: skip
    stats = [r["meta_info"]["nanospec"][-1] for r in results if r["meta_info"].get("nanospec")]
    covered = [s["coverage"] for s in stats if s.get("coverage") is not None]
    rows = [s["lm_head_rows_mean"] for s in stats if s.get("lm_head_rows_mean") is not None]
    return {
        "config": name,
        "accept_length": accepted / verifies if verifies else None,
        "coverage": sum(covered) / len(covered) if covered else None,
        "head_rows": sum(rows) / len(rows) if rows else None,
        "tokens_per_s": tokens / elapsed,
        "outputs": [r["output_ids"] for r in results],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="name or path")
    parser.add_argument("--eagle", nargs="*", default=[], help="EAGLE head directories")
    parser.add_argument("--standalone", nargs="*", default=[], help="draft model names or paths")
    parser.add_argument("--modes", nargs="+", default=["full", "nanospec"])
    parser.add_argument("--shape", type=_shape, action="append", help="STEPS,TOPK,TOKENS")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="auto", help="server --dtype")
    parser.add_argument("--prior-k", type=int, nargs="+", default=[0],
                        help="hybrid vocabulary sizes for the dynamic modes (--nanospec-prior-k)")  # fmt: skip
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not args.eagle and not args.standalone:
        parser.error("give at least one of --eagle or --standalone")
    for head in args.eagle:
        if not (Path(head) / "config.json").is_file():
            parser.error(f"--eagle: {head} is not a head directory (no config.json)")
    shapes = args.shape or [(4, 1, 5)]

    target = _model_dir(args.target)
    prompts = spec_bench_prompts(target, args.prompts)
    base = ["--model-path", str(target), "--max-total-tokens", "16384", "--dtype", args.dtype,
            "--mem-fraction-static", "0.4"]  # fmt: skip
    drafts = [("EAGLE", Path(h).name, Path(h)) for h in args.eagle]
    drafts += [("STANDALONE", s, _model_dir(s)) for s in args.standalone]
    rows = [run_config("plain", base, prompts, args.max_new_tokens)]
    for algorithm, label, path in drafts:
        for steps, topk, tokens in shapes:
            spec = speculative_flags(algorithm, path, steps, topk, tokens)
            for mode in args.modes:
                for prior_k in args.prior_k if mode not in ("full", "static") else [0]:
                    prior = f" prior {prior_k}" if prior_k else ""
                    name = f"{algorithm} {label} {steps},{topk},{tokens} {mode}{prior}"
                    flags = base + spec + ["--nanospec-mode", mode]
                    flags += ["--nanospec-prior-k", str(prior_k)]
                    rows.append(run_config(name, flags, prompts, args.max_new_tokens))
                    print(json.dumps({k: v for k, v in rows[-1].items() if k != "outputs"}), flush=True)  # fmt: skip

    plain = rows[0]
    print(f"command: {' '.join(sys.argv)}")
    print(f"{'config':<60}{'accept':>8}{'cover':>7}{'rows':>8}{'tok/s':>8}{'vs plain':>10}  outputs equal to plain")  # fmt: skip
    for r in rows:
        accept = f"{r['accept_length']:.2f}" if r["accept_length"] else "-"
        cover = f"{r['coverage']:.3f}" if r.get("coverage") is not None else "-"
        head_rows = f"{r['head_rows']:.0f}" if r.get("head_rows") is not None else "-"
        # In bf16 a batched verify and a one-token decode can round a near-tie apart
        # (README, "Numerics"): a prompt may differ in any speculative config, full
        # included; with --dtype float32 every output equals plain decoding.
        same = sum(a == b for a, b in zip(r["outputs"], plain["outputs"], strict=True))
        print(f"{r['config']:<60}{accept:>8}{cover:>7}{head_rows:>8}{r['tokens_per_s']:>8.2f}"
              f"{r['tokens_per_s'] / plain['tokens_per_s']:>9.2f}x  {same}/{len(prompts)}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "outputs"} for r in rows], indent=2))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
