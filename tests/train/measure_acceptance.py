"""Mean EAGLE acceptance length of a draft head on Spec-Bench first turns (manual tool).

    python -m tests.train.measure_acceptance --target qwen2.5-coder-0.5b-instruct \
        --draft <head dir> --modes full nanospec --count 10 --max-new-tokens 64

Prompts: the first turn of the first question of each category of
``question.jsonl`` (file order), up to ``--count``, wrapped in the target's chat
template. Greedy, num_steps 3, topk 1, 4 draft tokens. With ``--check-plain``
the outputs are also compared with plain decoding.
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from nanospec_server.bench.server import generate, running_server
from nanospec_server.train.target import resolve_target

SPECBENCH = Path("/work/shared/data/specbench/question.jsonl")


def first_turns(path: Path, count: int) -> list[str]:
    seen: dict[str, str] = {}
    for line in path.read_text().splitlines():
        question = json.loads(line)
        seen.setdefault(question["category"], question["turns"][0])
    return list(seen.values())[:count]


def chat_prompts(target: Path, turns: list[str]) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target)
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": turn}], add_generation_prompt=True, tokenize=True,
            return_dict=False,
        )
        for turn in turns
    ]  # fmt: skip


def run_all(url: str, prompts: list[list[int]], max_new_tokens: int) -> list[dict]:
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return list(pool.map(lambda ids: generate(url, ids, max_new_tokens), prompts))


def _first_difference(got: list[int], want: list[int]) -> int | None:
    """Index of the first differing output token; None when identical."""
    for index, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return index
    return None if len(got) == len(want) else min(len(got), len(want))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("--modes", nargs="+", default=["full", "nanospec"])
    parser.add_argument("--questions", type=Path, default=SPECBENCH)
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--check-plain", action="store_true")
    parser.add_argument("--dtype", default="auto", help="server --dtype (float32 avoids bf16 ties)")
    parser.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    args = parser.parse_args()

    target = resolve_target(args.target)
    prompts = chat_prompts(target, first_turns(args.questions, args.count))
    base = ["--model-path", str(target), "--mem-fraction-static", "0.4",
            "--max-total-tokens", "16384", "--dtype", args.dtype]  # fmt: skip
    plain = None
    if args.check_plain:
        with running_server(base, args.log_dir / "plain.log") as url:
            plain = [r["output_ids"] for r in run_all(url, prompts, args.max_new_tokens)]
    spec = ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(args.draft),
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4"]  # fmt: skip
    for mode in args.modes:
        started = time.monotonic()
        flags = base + spec + ["--nanospec-mode", mode]
        with running_server(flags, args.log_dir / f"spec-{mode}.log") as url:
            results = run_all(url, prompts, args.max_new_tokens)
        accept = [r["meta_info"]["spec_accept_length"] for r in results]
        # Token-weighted mean: total accepted tokens / total verify steps.
        tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
        verifies = sum(r["meta_info"]["spec_verify_ct"] for r in results)
        line = {
            "mode": mode,
            "per_prompt": [round(a, 3) for a in accept],
            "mean_of_prompts": round(sum(accept) / len(accept), 3),
            "tokens_per_verify": round(tokens / max(1, verifies), 3),
            "seconds": round(time.monotonic() - started, 1),
        }
        extra = {k: v for k, v in results[0]["meta_info"].items() if k.startswith("nanospec")}
        if extra:
            line["first_prompt_nanospec_stats"] = extra
        if plain is not None:
            line["first_difference"] = [_first_difference(r["output_ids"], p) for r, p in zip(results, plain, strict=True)]  # fmt: skip
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
