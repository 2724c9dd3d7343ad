"""What bit-identical greedy decoding costs on a CPU, op by op, side by side.

Our stand-in attention computes each query row over exactly its visible keys (so a verify
or prefill row equals a decode, bit for bit); the batched alternative is one masked SDPA
per request. Our packed linear sums row-invariant blocks of 1024 input features; the
alternative is one oneDNN call over the whole weight, which rounds a one-row call (a
decode) differently above 1024 features. Shapes: the 0.5B and 1.5B Qwen2.5 targets.

    OMP_NUM_THREADS=1 python benchmarks/bitwise_cost.py [--threads 2]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from nanospec_server.ops.packed_linear import layout, pack, packed_linear
from nanospec_server.sgl_kernel_cpu.ops.attention import extend_attention

# (name, query heads, kv heads, head dim, hidden, intermediate)
TARGETS = [("0.5B", 14, 2, 64, 896, 4864), ("1.5B", 12, 2, 128, 1536, 8960)]


def best_ms(fn: Callable[[], object], repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def attention_case(heads: int, kv_heads: int, dim: int, prefix: int, new: int, tree: bool):
    slots = prefix + new
    k_cache, v_cache = torch.randn(slots, kv_heads, dim), torch.randn(slots, kv_heads, dim)
    table = torch.arange(slots, dtype=torch.int32).view(1, -1)
    q = torch.randn(new, heads, dim)
    k_new, v_new = k_cache[prefix:], v_cache[prefix:]
    causal = torch.ones(new, new, dtype=torch.bool).tril()
    out = torch.empty_like(q)
    scale = dim**-0.5

    def ours() -> None:
        extend_attention(
            q, k_new, v_new, out, k_cache, v_cache, 1.0, 1.0, table,
            torch.zeros(1, dtype=torch.int64), torch.tensor([slots]), torch.tensor([new]),
            torch.tensor([0]), new, scale, 0.0, False, 0, None, None,
            causal.flatten() if tree else None, True,
        )  # fmt: skip

    visible = torch.cat([torch.ones(new, prefix, dtype=torch.bool), causal], dim=1)

    def batched() -> None:
        group = heads // kv_heads
        k = k_cache.repeat_interleave(group, dim=1).transpose(0, 1)
        v = v_cache.repeat_interleave(group, dim=1).transpose(0, 1)
        F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=visible, scale=scale)

    return ours, batched


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}; best of 5, ms per call (one layer)")
    print("| target | op | row-invariant (ours) | batched | ratio |\n|---|---|---|---|---|")
    for name, heads, kv_heads, dim, hidden, inter in TARGETS:
        for label, prefix, new, tree in [
            ("verify 8 after 512", 512, 8, True),
            ("verify 20 after 512", 512, 20, True),
            ("prefill 512", 0, 512, False),
        ]:
            ours, batched = attention_case(heads, kv_heads, dim, prefix, new, tree)
            a, b = best_ms(ours), best_ms(batched)
            print(f"| {name} | attention, {label} | {a:.2f} | {b:.2f} | {a / b:.2f}x |")
        for out_f, in_f in [(2 * inter, hidden), (hidden, inter)]:
            weight = torch.randn(out_f, in_f)
            blocked = pack(weight)
            whole = torch.ops.mkldnn._reorder_linear_weight(weight, layout().batch_hint)
            for rows in (1, 8):
                x = torch.randn(rows, in_f)
                a = best_ms(lambda x=x, w=blocked: packed_linear(x, w, None))
                b = best_ms(
                    lambda x=x, w=whole: torch.ops.mkldnn._linear_pointwise(
                        x, w, None, "none", [], ""
                    )
                )
                print(f"| {name} | linear {out_f}x{in_f}, {rows} row(s) | {a:.2f} | {b:.2f} | {a / b:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
