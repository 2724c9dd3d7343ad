"""Default training sizes per target, chosen to finish on a 2-core CPU in <= 90 minutes.

Measured on this project's 2-core AMD EPYC box (avx512_bf16, shared, niced):
target feature extraction at seq_len 512 runs ~86 tok/s for Qwen2.5-Coder-0.5B
(bf16) and ~30 tok/s for 1.5B; head training: see ``nanospec_server/train/README.md``.
Extraction dominates, so the token budget is what the recipe trades.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Recipe:
    tokens: int  # training tokens whose target features are extracted
    val_tokens: int
    seq_len: int
    steps: int
    batch_rows: int
    lr: float
    warmup_steps: int
    cls_stride: int


# Small enough for any target; what unknown models and the tiny test models get.
GENERIC = Recipe(
    tokens=65_536, val_tokens=4_096, seq_len=256, steps=400, batch_rows=8, lr=1e-3,
    warmup_steps=20, cls_stride=8,
)  # fmt: skip

RECIPES: dict[str, Recipe] = {
    # ~0.5B: ~24 min extraction (124k tok) + ~55 min training (3 epochs) on 2 cores.
    "qwen2.5-coder-0.5b-instruct": Recipe(
        tokens=122_880,
        val_tokens=4_096,
        seq_len=512,
        steps=720,
        batch_rows=4,
        lr=5e-4,
        warmup_steps=30,
        cls_stride=8,
    ),  # fmt: skip
    # ~1.5B: ~32 min extraction (57k tok) + ~50 min training on 2 cores.
    "qwen2.5-coder-1.5b-instruct": Recipe(
        tokens=57_344,
        val_tokens=2_048,
        seq_len=512,
        steps=420,
        batch_rows=4,
        lr=5e-4,
        warmup_steps=30,
        cls_stride=8,
    ),  # fmt: skip
}


def recipe_for(target: str, **overrides: object) -> Recipe:
    """The recipe of registry name ``target`` (GENERIC otherwise), with non-None overrides."""
    base = RECIPES.get(target, GENERIC)
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
