"""LM-head time per draft step: full head vs FR-Spec static head vs index_select vs packed.

    python benchmarks/lm_head.py                      # the whole grid
    python benchmarks/lm_head.py --shapes 1536x151936 --batches 1 --steps 10   # quick

Each request starts with a full window (prompt + prefill candidates) and then, every step,
appends a draft tree and verify candidates drawn from a Zipf-like distribution plus a few
fresh tokens, so tens of tokens enter (and leave) each window per step. Every variant
computes logits for the same hidden rows, a softmax and a top-k; medians over the steps.
"""

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from nanospec_server.vocab import DynamicVocab

SHAPES = ("896x151936", "1536x151936", "2048x128256", "4096x128256")
STATIC_VOCAB = 32768  # FR-Spec's frequency-ranked head


def median_ms(step: Callable[[int], object], steps: int, warmup: int) -> float:
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        step(i)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def zipf_tokens(vocab_size: int, shape: tuple[int, ...], generator: torch.Generator):
    """Token ids with a text-like skew (a few tokens frequent, a long tail). The frequency
    ranking is one fixed shuffle of the ids: every request speaks the same language."""
    ranks = torch.arange(1, vocab_size + 1, dtype=torch.float64)
    flat = torch.multinomial(
        ranks.pow(-1.1), int(torch.tensor(shape).prod()), True, generator=generator
    )
    language = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(vocab_size))
    return language[flat].view(shape)


def step_streams(args, vocab_size: int, batch: int, generator: torch.Generator):
    """Per step and request: draft-tree tokens (skewed) then fresh verify candidates."""
    total = args.warmup + args.steps
    tree = zipf_tokens(vocab_size, (total, batch, args.tree_tokens), generator)
    fresh = torch.randint(0, vocab_size, (total, batch, args.fresh_tokens), generator=generator)
    return torch.cat([tree, fresh], dim=2)


def bench_shape(args, hidden: int, vocab_size: int, batch: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    dtype = getattr(torch, args.dtype)
    weight = (torch.randn(vocab_size, hidden, generator=generator) * 0.02).to(dtype)
    static = weight[:STATIC_VOCAB].clone()
    rows = batch * args.rows_per_request
    hiddens = torch.randn(rows, hidden, generator=generator).to(dtype)
    row_slots = torch.arange(1, batch + 1).repeat_interleave(args.rows_per_request)
    slots = torch.arange(1, batch + 1)
    k = args.k

    def head(logits: torch.Tensor):
        return torch.softmax(logits.float(), -1).topk(k, dim=-1)

    vocab = DynamicVocab(weight, batch + 1, w_cap=args.w_max, w_max=args.w_max, max_batch=batch)
    prompt = zipf_tokens(vocab_size, (batch, 2 * args.w_max), generator)
    vocab.append(slots, prompt)
    vocab.refresh(slots)
    streams = step_streams(args, vocab_size, batch, generator)
    entered = []

    def update(i: int) -> None:
        before = int(vocab.head.count)
        vocab.append(slots, streams[i])
        vocab.refresh(slots)
        entered.append(int(vocab.head.count) - before)

    def active_ids() -> list[torch.Tensor]:
        members = vocab.window.members[slots, : args.w_max]
        return [row[row >= 0] for row in members]

    actives = active_ids()
    results = {
        "full": median_ms(lambda i: head(hiddens @ weight.T), args.steps, args.warmup),
        "static_32k": median_ms(lambda i: head(hiddens @ static.T), args.steps, args.warmup),
    }

    def index_select_step(i: int) -> None:
        for r, ids in enumerate(actives):  # each request gathers its own I, every step
            part = hiddens[r * args.rows_per_request : (r + 1) * args.rows_per_request]
            head(part @ weight.index_select(0, ids).T)

    results["index_select"] = median_ms(index_select_step, args.steps, args.warmup)
    results["packed_update"] = median_ms(update, args.steps, args.warmup)
    results["packed_topk"] = median_ms(
        lambda i: vocab.topk(hiddens, row_slots, k), args.steps, args.warmup
    )
    results["packed"] = results["packed_update"] + results["packed_topk"]
    sizes = vocab.active_size(slots)
    return {
        "hidden": hidden,
        "vocab": vocab_size,
        "batch": batch,
        "ms": results,
        "speedup_vs_full": {name: results["full"] / ms for name, ms in results.items() if ms > 0},
        "update_share_of_packed_head": results["packed_update"] / results["packed_topk"],
        "rows_read": {
            "full": vocab_size,
            "static_32k": STATIC_VOCAB,
            "index_select": int(sizes.sum()),
            "packed": vocab.rows_computed,
        },
        "new_rows_per_step": statistics.median(entered) if entered else 0,
        "mean_active_size": float(sizes.float().mean()),
        "state_bytes": vocab.nbytes(),
    }


def table(results: list[dict]) -> str:
    lines = [
        "| d | V | B | full ms | static32k ms | index_select ms | packed ms (update + topk) "
        "| packed speedup | update/topk | rows read (packed) | new rows/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        ms = r["ms"]
        lines.append(
            f"| {r['hidden']} | {r['vocab']} | {r['batch']} | {ms['full']:.2f} "
            f"| {ms['static_32k']:.2f} | {ms['index_select']:.2f} "
            f"| {ms['packed']:.2f} ({ms['packed_update']:.2f} + {ms['packed_topk']:.2f}) "
            f"| {r['speedup_vs_full']['packed']:.1f}x | {100 * r['update_share_of_packed_head']:.0f}% "
            f"| {r['rows_read']['packed']} | {r['new_rows_per_step']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma list of dxV")
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--w-max", type=int, default=3072)
    parser.add_argument("--rows-per-request", type=int, default=1, help="hidden rows (tree)")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--tree-tokens", type=int, default=48, help="draft tree tokens/step")
    parser.add_argument("--fresh-tokens", type=int, default=16, help="uniform new tokens/step")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--json", default="", help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    for shape in args.shapes.split(","):
        hidden, vocab_size = (int(x) for x in shape.split("x"))
        for batch in (int(b) for b in args.batches.split(",")):
            results.append(bench_shape(args, hidden, vocab_size, batch))
            print(table(results[-1:]).splitlines()[-1], flush=True)
    print(f"\ndtype {args.dtype}, threads {args.threads}, W_max {args.w_max}\n")
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
