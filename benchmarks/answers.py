"""Self-distillation answering speed: answer tokens per minute, configurations side by side.

Each configuration (target dtype, prompts per batch, attention: transformers' ``sdpa``,
which copies K/V per query head under a mask, or ``grouped``, `train/attention.py`, and
optionally ``packed``: fp32 linear layers through oneDNN, `ops/packed_linear.py`, as
`train/run.py` answers) answers the same training prompts
with `train/distill.py:generate_rows`, answers capped at ``--max-answer`` tokens. The
configurations take turns: the prompts are cut into groups of the largest batch and
every configuration answers a group before the next group starts, so a change in the
load of a shared machine hits all of them alike. Reported: answer tokens per minute of
wall time and of this process's CPU time (what a one-thread run gets when the machine
is busy with other work), each with its ratio to the first configuration.

    OMP_NUM_THREADS=1 python benchmarks/answers.py --target qwen2.5-coder-0.5b-instruct \
        --prompts 128 --max-answer 64 --config float32,32,sdpa --config float32,128,grouped,packed
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import torch

from nanospec_server.models.chat import encode_user_turns
from nanospec_server.ops.packed_linear import pack_linear_layers
from nanospec_server.train.attention import use_grouped_sdpa
from nanospec_server.train.distill import generate_rows
from nanospec_server.train.prompts import Split, chat_prompts
from nanospec_server.train.run import _eos_ids
from nanospec_server.train.target import load_target, load_tokenizer, resolve_target


@dataclass
class Tally:
    dtype: torch.dtype
    batch: int
    attention: str
    packed: bool = False
    answered: int = 0
    wall: float = 0.0
    cpu: float = 0.0


def _config(text: str) -> Tally:
    parts = text.split(",")
    dtype, batch, attention, linear = parts + ["grouped", "plain"][len(parts) - 2 :]
    if attention not in ("sdpa", "grouped"):
        raise argparse.ArgumentTypeError(f"attention must be sdpa or grouped, not {attention!r}")
    if linear not in ("plain", "packed"):
        raise argparse.ArgumentTypeError(f"linear must be plain or packed, not {linear!r}")
    return Tally(getattr(torch, dtype), int(batch), attention, linear == "packed")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--max-answer", type=int, default=64)
    parser.add_argument("--max-prompt", type=int, default=160, help="skip longer prompts")
    parser.add_argument(
        "--config", type=_config, action="append", help="DTYPE,BATCH[,sdpa|grouped[,plain|packed]]"
    )
    args = parser.parse_args()
    tallies = args.config or [_config("float32,32,sdpa"), _config("float32,128,grouped")]
    target_dir = resolve_target(args.target)
    tokenizer = load_tokenizer(target_dir)
    eos = _eos_ids(target_dir, tokenizer)
    texts = chat_prompts(Split.TRAIN, args.prompts * 2, seed=0)
    prompts = sorted([p for p in encode_user_turns(tokenizer, texts) if len(p) <= args.max_prompt][: args.prompts], key=len)  # fmt: skip
    seq_len = max(map(len, prompts)) + args.max_answer
    targets = {(t.dtype, t.packed): None for t in tallies}
    for dtype, packed in targets:
        target = load_target(target_dir, torch.device("cpu")).to(dtype)
        if packed:
            pack_linear_layers(target)
        targets[dtype, packed] = target
    print(f"command: {' '.join(sys.argv)}  (threads {torch.get_num_threads()})")
    group = max(t.batch for t in tallies)
    for start in range(0, len(prompts), group):
        for tally in tallies:
            target = targets[tally.dtype, tally.packed]
            if tally.attention == "grouped":
                use_grouped_sdpa(target)
            else:
                target.set_attn_implementation("sdpa")
            wall, cpu = time.perf_counter(), time.process_time()
            for first in range(start, min(start + group, len(prompts)), tally.batch):
                chunk = prompts[first : min(first + tally.batch, start + group)]
                rows = generate_rows(target, chunk, seq_len, eos, torch.device("cpu"))
                tally.answered += int((rows.lengths - rows.prompt_lengths).sum())
            tally.wall += time.perf_counter() - wall
            tally.cpu += time.process_time() - cpu
    base_wall, base_cpu = (
        tallies[0].answered / tallies[0].wall,
        tallies[0].answered / tallies[0].cpu,
    )
    print(f"{'dtype':<16}{'batch':>6}{'attention':>10}{'linear':>8}{'answer tokens':>15}{'per wall min':>14}{'ratio':>8}"
          f"{'per CPU min':>13}{'ratio':>8}")  # fmt: skip
    for t in tallies:
        wall, cpu = t.answered / t.wall, t.answered / t.cpu
        linear = "packed" if t.packed else "plain"
        print(f"{str(t.dtype):<16}{t.batch:>6}{t.attention:>10}{linear:>8}{t.answered:>15}{wall * 60:>14.0f}{wall / base_wall:>7.2f}x"
              f"{cpu * 60:>13.0f}{cpu / base_cpu:>7.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
