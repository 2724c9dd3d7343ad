"""The hybrid prior's k on prompts nobody tuned on: window ∪ prior coverage, offline.

`nanospec vocab prior-k` chooses k on the trainer's prompts; this replays Spec-Bench
prompts (other seed, other text) through the serving window for given sizes, with the
head's time measured at the rows each size computes, to check whether the chosen k holds:

    python benchmarks/prior_k_holdout.py --k 0 2048 <chosen> \\
        --latency <bench latency dir>/latency.json --out /tmp/holdout

The target's greedy outputs are cached in ``--out`` (answers.jsonl), so a second call with
other sizes only replays.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main() -> None:
    from nanospec_server.bench.coverage import generate_outputs
    from nanospec_server.bench.data import load_tasks
    from nanospec_server.train.target import load_target, load_tokenizer, resolve_target
    from nanospec_server.vocab_tools.prior import ranked_tokens
    from nanospec_server.vocab_tools.prior_tune import HeadTimer, PriorProblem
    from nanospec_server.vocab_tools.replay import Sequence, target_topk

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--k", type=int, nargs="+", required=True, help="prior sizes to compare")
    parser.add_argument("--latency", type=Path, required=True, help="bench latency's latency.json")
    parser.add_argument("--seed", type=int, default=1, help="prompt draw (the report's: 1)")
    parser.add_argument("--limit-per-task", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--w-max", type=int, default=3072)
    parser.add_argument("--step-tokens", type=int, default=3)
    parser.add_argument("--specbench", type=Path, help="Spec-Bench question.jsonl")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    torch.set_num_threads(1)
    model_dir = resolve_target(args.target)
    tokenizer = load_tokenizer(model_dir)
    model = load_target(model_dir, torch.device("cpu"), torch.float32)
    args.out.mkdir(parents=True, exist_ok=True)
    cached = args.out / "answers.jsonl"
    if not cached.is_file():
        prompts = load_tasks(args.specbench, args.limit_per_task, args.seed,
                             ("conversation", "translation", "summarization", "qa", "math", "rag", "code"))  # fmt: skip
        raw = generate_outputs(model, tokenizer, prompts, args.max_new_tokens)
        cached.write_text("".join(json.dumps({"id": i, "task": t, "prompt_ids": p, "answer_ids": o}) + "\n"
                                  for i, t, p, o in raw))  # fmt: skip
    records = [json.loads(line) for line in cached.read_text().splitlines()]
    sequences = [Sequence(r["prompt_ids"], r["answer_ids"],
                          target_topk(model, r["prompt_ids"] + r["answer_ids"], 3), r["task"])
                 for r in records if r["answer_ids"]]  # fmt: skip
    weight = model.lm_head.weight.detach()
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    timed = json.loads(args.latency.read_text())["breakdown"]
    backbone_ms, head_dtype = timed["backbone"], getattr(torch, timed["dtype"])
    problem = PriorProblem(sequences, ranked_tokens(tokenizer), eos, weight.shape[0], backbone_ms,
                           HeadTimer(weight.to(head_dtype)), args.w_max, args.step_tokens)  # fmt: skip
    rows = [problem.evaluate(k) for k in args.k]
    (args.out / "holdout.json").write_text(json.dumps({"rows": rows, "prompts": [r["id"] for r in records],
                                                       "settings": {k: str(v) for k, v in vars(args).items()}}, indent=2))  # fmt: skip
    print("| prior k | coverage | mean rows | step ms (backbone + head) | utility |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['k']} | {r['coverage']:.4f} | {r['mean_rows']:.0f} | {r['step_ms']:.3f} | {r['utility']:.4f} |")  # fmt: skip


if __name__ == "__main__":
    main()
