"""What a verify pass costs against a one-token decode on this CPU, by linear kernel.

Speculative decoding pays when verifying k tokens costs little more than decoding one.
This times a real model's forward over n new tokens after a cached prefix, side by side:
bf16 and fp32 with ``F.linear`` (SGLang's CPU path without AMX) and fp32 with oneDNN
prepacked weights (``sglang_plugin/cpu/linear.py``, what ``nanospec serve`` uses), each
as a ratio to its own one-token forward.

    OMP_NUM_THREADS=1 python benchmarks/cpu_linear.py --model qwen2.5-coder-1.5b-instruct
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from nanospec_server.models.prepare import prepare_model
from nanospec_server.sglang_plugin.cpu.linear import pack, packed_linear


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.packed = pack(linear.weight)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.packed, self.bias)


def pack_linears(module: nn.Module) -> None:
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, PackedLinear(child))
        else:
            pack_linears(child)


@torch.no_grad()
def forward_ms(model: nn.Module, prefix: int, new: int, repeats: int) -> float:
    """Best-of-``repeats`` milliseconds of a forward over ``new`` tokens after ``prefix``."""
    cache = model(torch.randint(0, 1000, (1, prefix)), use_cache=True).past_key_values
    best = float("inf")
    for _ in range(repeats):
        fresh = copy.deepcopy(cache)
        ids = torch.randint(0, 1000, (1, new))
        start = time.perf_counter()
        model(ids, past_key_values=fresh, use_cache=True)
        best = min(best, time.perf_counter() - start)
    return 1000 * best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 5, 8])
    parser.add_argument("--prefix", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = prepare_model(args.model)
    variants = (("bf16, F.linear", torch.bfloat16, False), ("fp32, F.linear", torch.float32, False),
                ("fp32, oneDNN packed", torch.float32, True))  # fmt: skip
    print(f"{args.model}, prefix {args.prefix}, {args.threads} thread(s), best of {args.repeats}")
    print("| linear | " + " | ".join(f"{n} tokens" for n in args.tokens) + " |")
    print("|---|" + "---|" * len(args.tokens))
    for label, dtype, packed in variants:
        model = AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=dtype).eval()
        if packed:
            pack_linears(model)
        times = [forward_ms(model, args.prefix, n, args.repeats) for n in args.tokens]
        cells = [f"{t:.0f} ms ({t / times[0]:.2f}x)" for t in times]
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
        del model


if __name__ == "__main__":
    main()
