"""Validation curves of trained EAGLE heads: held-out top-1 and chain-4 acceptance against
answer tokens trained on, read from each head's ``nanospec_head.json`` (``train/loop.py``
validates at the start, every quarter and at the end).

x is the answer tokens the head has been trained on: steps x rows per step x the mean
answer tokens of a training row. A head continued from another (``--init-head``) starts
where that one ended (``LABEL=DIR@OFFSET_HEAD_DIR``), so one line continues the other.

    python benchmarks/head_curves.py --out docs/results/head_curves.png \
        shipped=nanospec_server/models/heads/qwen2.5-coder-0.5b-instruct-eagle \
        "continued=DIR@nanospec_server/models/heads/qwen2.5-coder-0.5b-instruct-eagle"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _info(head_dir: str) -> dict:
    return json.loads((Path(head_dir) / "nanospec_head.json").read_text())


def tokens_per_step(info: dict) -> float:
    return info["recipe"]["batch_rows"] * info["train_answer_tokens"] / info["train_rows"]


def curve(info: dict, offset: float = 0.0) -> list[dict]:
    """Each validation point with ``tokens``: answer tokens trained on up to it."""
    per_step = tokens_per_step(info)
    return [{**e, "tokens": offset + e["step"] * per_step} for e in info["evals"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("heads", nargs="+", help="LABEL=HEAD_DIR[@HEAD_DIR_IT_CONTINUES]")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top1_ax, chain_ax) = plt.subplots(1, 2, figsize=(8, 3), dpi=90)
    for spec in args.heads:
        label, _, dirs = spec.partition("=")
        head_dir, _, base_dir = dirs.partition("@")
        offset = 0.0
        if base_dir:
            base = _info(base_dir)
            offset = base["evals"][-1]["step"] * tokens_per_step(base)
        points = curve(_info(head_dir), offset)
        xs = [p["tokens"] / 1e3 for p in points]
        top1_ax.plot(xs, [p["top1"] for p in points], marker="o", label=label)
        chain = [(x, p["chain4_acceptance"]) for x, p in zip(xs, points, strict=True) if "chain4_acceptance" in p]  # fmt: skip
        if chain:
            chain_ax.plot([x for x, _ in chain], [a for _, a in chain], marker="o", label=label)
        for p in points:
            print(f"{label:<24}step {p['step']:>5}  tokens {p['tokens']:>10.0f}  "
                  f"top1 {p['top1']:.3f}  chain4 {p.get('chain4_acceptance', float('nan')):.3f}")  # fmt: skip
    top1_ax.set(xlabel="answer tokens trained on (k)", ylabel="held-out top-1")
    chain_ax.set(xlabel="answer tokens trained on (k)", ylabel="chain-4 tokens / verification")
    for ax in (top1_ax, chain_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
