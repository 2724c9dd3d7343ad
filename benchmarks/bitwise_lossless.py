"""Speculative greedy decoding of a real model, bit for bit against plain decoding.

Plain decoding and each speculative configuration serve the same prompts (one server at a
time, the prompts sent together so they batch, or ``--one-at-a-time``), with every output
token's log-probability.
Where speculation is bit-identical (fp32 or bf16 on a CPU through our kernels, see
docs/cpu.md, "Exactness"), every token and every log-probability must be the same: a difference is a bug.
The speculative servers prefill in chunks of ``--chunk`` tokens while plain decoding takes
each prompt whole, so prefill chunking is checked too.

    python benchmarks/bitwise_lossless.py --max-new-tokens 256            # 0.5B + EAGLE head
    python benchmarks/bitwise_lossless.py --pair default --max-new-tokens 128  # 1.5B + 0.5B
    python benchmarks/bitwise_lossless.py --pair default --dtype bfloat16

Each server's wall time is reported beside the check, so one bf16 run also gives what
speculation costs against plain decoding there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from transformers import AutoTokenizer

from nanospec_server import host
from nanospec_server.bench.data import load_tasks
from nanospec_server.launch.server import generate, running_server, speculative_flags
from nanospec_server.models.chat import encode_chat
from nanospec_server.models.eagle_heads import get_head_spec, head_dir
from nanospec_server.models.prepare import prepare_model

TASKS = ("conversation", "translation", "qa", "math", "code")


def pairs() -> dict[str, tuple[str, dict[str, list[str]]]]:
    """target -> speculative configurations (name -> flags)."""
    head = str(head_dir(get_head_spec("qwen2.5-coder-0.5b-instruct-eagle")))
    draft = str(prepare_model("qwen2.5-coder-0.5b-instruct"))
    eagle = speculative_flags("EAGLE", head, 4, 4, 8)
    standalone = speculative_flags("STANDALONE", draft, 4, 1, 5)
    return {
        "eagle": ("qwen2.5-coder-0.5b-instruct", {
            "eagle-full": eagle + ["--nanospec-mode", "full"],
            "eagle-nanospec": eagle + ["--nanospec-mode", "nanospec"],
            "eagle-nanospec-p2048": eagle + ["--nanospec-mode", "nanospec", "--nanospec-prior-k", "2048"],
        }),
        "default": ("qwen2.5-coder-1.5b-instruct", {
            "standalone-nanospec-p2048": standalone + ["--nanospec-mode", "nanospec", "--nanospec-prior-k", "2048"],
        }),
    }  # fmt: skip


def answers(url: str, prompts: list[list[int]], max_new_tokens: int, together: bool) -> list[dict]:
    def one(input_ids: list[int]) -> dict:
        reply = generate(url, input_ids, max_new_tokens, return_logprob=True)
        meta = reply["meta_info"]
        return {"ids": reply["output_ids"],
                "logprobs": [entry[0] for entry in meta["output_token_logprobs"]],
                "accept": meta.get("spec_accept_length")}  # fmt: skip

    with ThreadPoolExecutor(max_workers=len(prompts) if together else 1) as pool:
        return list(pool.map(one, prompts))


def first_difference(plain: dict, spec: dict) -> str | None:
    for i, (a, b) in enumerate(zip(plain["ids"], spec["ids"], strict=False)):
        if a != b:
            return f"token {i}: {a} vs {b}"
    for i, (a, b) in enumerate(zip(plain["logprobs"], spec["logprobs"], strict=False)):
        if a != b:
            return f"logprob {i}: {a!r} vs {b!r}"
    if len(plain["ids"]) != len(spec["ids"]):
        return f"length {len(plain['ids'])} vs {len(spec['ids'])}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=("eagle", "default"), default="eagle")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--limit-per-task", type=int, default=1)
    parser.add_argument("--seed", type=int, default=7, help="prompt draw (not a tuned-on seed)")
    parser.add_argument("--chunk", type=int, default=64, help="speculative prefill chunk size")
    parser.add_argument(
        "--one-at-a-time", action="store_true",
        help="send the prompts one after another (a decode of one row against a verify of "
        "several), not together",
    )  # fmt: skip
    parser.add_argument("--specbench", type=Path, default=None)
    parser.add_argument("--configs", nargs="+", help="a subset of the pair's configurations")
    parser.add_argument("--out", type=Path, default=Path("bench_results/bitwise_lossless.json"))
    args = parser.parse_args()

    target_name, configs = pairs()[args.pair]
    if args.configs:
        unknown = set(args.configs) - set(configs)
        if unknown:
            parser.error(f"--configs: {sorted(unknown)} not among {sorted(configs)}")
        configs = {name: configs[name] for name in args.configs}
    target = prepare_model(target_name)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    chats = load_tasks(args.specbench, args.limit_per_task, args.seed, TASKS)
    prompts = [encode_chat(tokenizer, [chat.turns[0]], []) for chat in chats]
    base = ["--model-path", str(target), "--dtype", args.dtype, "--max-total-tokens", "8192"]
    expected = host.bitwise_lossless(args.dtype)
    print(f"{len(prompts)} prompts ({', '.join(c.id for c in chats)}), {args.max_new_tokens} "
          f"new tokens; bit-identical expected on this host: {expected}", flush=True)  # fmt: skip

    log_dir = args.out.parent / "bitwise_logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    results, timings = {}, {}
    runs = {"plain": []} | {name: flags + ["--chunked-prefill-size", str(args.chunk)]
                             for name, flags in configs.items()}  # fmt: skip
    for name, flags in runs.items():
        with running_server(base + flags, log_dir / f"{name}.log") as url:
            start = time.perf_counter()
            results[name] = answers(url, prompts, args.max_new_tokens, not args.one_at_a_time)
            timings[name] = time.perf_counter() - start
        print(f"{name}: {timings[name]:.1f} s", flush=True)

    report = {"pair": args.pair, "target": target_name, "dtype": args.dtype,
              "one_at_a_time": args.one_at_a_time,
              "max_new_tokens": args.max_new_tokens,
              "prompts": [c.id for c in chats], "bitwise_expected": expected,
              "seconds": timings, "configs": {}}  # fmt: skip
    failures = 0
    for name in configs:
        diffs = {chat.id: d for chat, p, s in zip(chats, results["plain"], results[name], strict=True)
                 if (d := first_difference(p, s))}  # fmt: skip
        tokens = sum(len(r["ids"]) for r in results[name])
        accept = [r["accept"] for r in results[name] if r["accept"]]
        report["configs"][name] = {"differing": diffs, "tokens": tokens,
                                   "mean_accept": sum(accept) / max(len(accept), 1)}  # fmt: skip
        failures += len(diffs)
        print(f"{name}: {len(diffs)} of {len(prompts)} differ ({tokens} tokens compared, "
              f"mean acceptance {report['configs'][name]['mean_accept']:.2f}) {diffs or ''}")  # fmt: skip
    args.out.write_text(json.dumps(report, indent=2))
    print(f"results in {args.out}")
    return 1 if failures and expected else 0


if __name__ == "__main__":
    sys.exit(main())
