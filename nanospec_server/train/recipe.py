"""Default training sizes per target, chosen to finish on a 2-core CPU in <= 90 minutes.

Measured on this project's shared 2-core AMD EPYC box (avx512_bf16, load ~5 from
other jobs, niced, 2 threads), seq_len 256, 4 rows per step:

* Qwen2.5-Coder-0.5B: feature extraction ~45-50 tok/s (bf16 target), head
  training ~146 tok/s (7 s per 1020-token step, fp32, LM-head loss on 1/8 of
  the positions; bf16 autocast is ~1.37x faster, so these times have slack), one validation pass over 2k tokens ~25 s.
* Qwen2.5-Coder-1.5B: extraction ~14 tok/s while another extraction ran
  (extrapolated ~15-25 alone); training extrapolated ~3x slower than 0.5B
  (3.1x the head parameters, 1.7x the LM-head width): ~50 tok/s.

Extraction dominates, so the recipes trade tokens against optimizer steps; see
``nanospec_server/train/README.md`` for the arithmetic. On a GPU both phases are
two orders of magnitude faster: pass larger --tokens/--steps there.
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
    # 110.6k tok / ~48 tok/s = ~38 min extraction; 360 steps x 7 s = ~42 min training
    # (3.3 epochs); 5 validation passes ~2 min. Total ~82 min.
    "qwen2.5-coder-0.5b-instruct": Recipe(
        tokens=110_592,
        val_tokens=2_048,
        seq_len=256,
        steps=360,
        batch_rows=4,
        lr=1e-3,
        warmup_steps=20,
        cls_stride=8,
    ),  # fmt: skip
    # 36.9k tok / ~15 tok/s = ~41 min extraction; 130 steps x ~20 s = ~43 min training
    # (3.6 epochs). Total ~87 min. Extrapolated, not run end to end.
    "qwen2.5-coder-1.5b-instruct": Recipe(
        tokens=36_864,
        val_tokens=1_024,
        seq_len=256,
        steps=130,
        batch_rows=4,
        lr=1e-3,
        warmup_steps=10,
        cls_stride=8,
    ),  # fmt: skip
}


def recipe_for(target: str, **overrides: object) -> Recipe:
    """The recipe of registry name ``target`` (GENERIC otherwise), with non-None overrides."""
    base = RECIPES.get(target, GENERIC)
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
