"""Self-distillation answering speed: answer tokens per minute, configurations side by side.

Each configuration (target dtype, prompts per batch) answers the same training prompts
with `train/distill.py:generate_rows`, answers capped at ``--max-answer`` tokens, one
after the other in one run, and reports answer tokens per minute and the ratio to the
first configuration (the recipe before issue 12: bf16, 32 prompts per batch).

    OMP_NUM_THREADS=1 python benchmarks/answers.py --target qwen2.5-coder-0.5b-instruct \
        --prompts 64 --max-answer 64 --config bfloat16,32 --config float32,32 --config float32,64
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from nanospec_server.models.chat import encode_user_turns
from nanospec_server.train.distill import generate_rows
from nanospec_server.train.prompts import Split, chat_prompts
from nanospec_server.train.run import _eos_ids
from nanospec_server.train.target import load_target, load_tokenizer, resolve_target


def _config(text: str) -> tuple[torch.dtype, int]:
    dtype, batch = text.split(",")
    return getattr(torch, dtype), int(batch)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-answer", type=int, default=64)
    parser.add_argument("--max-prompt", type=int, default=160, help="skip longer prompts")
    parser.add_argument("--config", type=_config, action="append", help="DTYPE,BATCH")
    args = parser.parse_args()
    configs = args.config or [(torch.bfloat16, 32), (torch.float32, 64)]
    target_dir = resolve_target(args.target)
    tokenizer = load_tokenizer(target_dir)
    eos = _eos_ids(target_dir, tokenizer)
    texts = chat_prompts(Split.TRAIN, args.prompts * 2, seed=0)
    prompts = sorted([p for p in encode_user_turns(tokenizer, texts) if len(p) <= args.max_prompt][: args.prompts], key=len)  # fmt: skip
    seq_len = max(map(len, prompts)) + args.max_answer
    print(f"command: {' '.join(sys.argv)}  (threads {torch.get_num_threads()})")
    base = None
    for dtype, batch in configs:
        target = load_target(target_dir, torch.device("cpu")).to(dtype)
        started, answered = time.perf_counter(), 0
        for first in range(0, len(prompts), batch):
            chunk = prompts[first : first + batch]
            rows = generate_rows(target, chunk, seq_len, eos, torch.device("cpu"))
            answered += int((rows.lengths - rows.prompt_lengths).sum())
        per_minute = answered / (time.perf_counter() - started) * 60
        base = base or per_minute
        print(f"{str(dtype):<16}{batch:>6} prompts/batch {answered:>7} answer tokens "
              f"{per_minute:>9.0f} tokens/min {per_minute / base:>6.2f}x", flush=True)  # fmt: skip
        del target
    return 0


if __name__ == "__main__":
    sys.exit(main())
