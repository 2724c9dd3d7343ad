"""Default training sizes per target, chosen to finish on a 2-core CPU in <= 90 minutes.

The times per phase that size them are in docs/results.md, "Training times"; see
``nanospec_server/train/README.md`` for the times of a full run. On a GPU both
phases are two orders of magnitude faster: pass larger --tokens/--steps there.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Recipe:
    tokens: int  # rows x seq_len: how many training prompts the target answers
    val_tokens: int
    seq_len: int
    steps: int
    batch_rows: int
    lr: float
    warmup_steps: int
    cls_stride: int
    cls_weight: float = 0.1  # EAGLE-1's ratio to the regression loss
    # Prompts answered together while collecting features. A CPU decode step reads every
    # weight once whatever the batch, so wider batches answer more tokens per minute
    # (benchmarks/answers.py); 128 rows of 320 tokens hold ~1 GB of 0.5B K/V in fp32.
    gen_batch: int = 128
    # The target's dtype while answering; auto: fp32 on a CPU, bf16 on CUDA, since torch's
    # CPU bf16 matmuls answer fewer tokens per minute (benchmarks/answers.py; docs/results.md,
    # "Training times").
    answer_dtype: str = "auto"
    unroll_steps: int = 1  # training-time test steps (1: teacher forcing only)
    intermediate_size: int | None = None  # the head's MLP width (None: the target's)
    init_from_target: bool = False  # start the layer from the target's last decoder layer
    init_head: str | None = None  # continue training this head directory (same shapes)
    # EAGLE-3 (--arch eagle3, eagle3_run.py)
    arch: str = "eagle1"
    draft_vocab_size: int = 32_768  # SpecForge's default; 0: share the target's LM head
    aux_layers: tuple[int, ...] | None = None  # None: SGLang's default layers
    train_lm_head: bool = False  # False: keep the target's rows of D (fewer parameters)


# Small enough for any target; what unknown models and the tiny test models get.
GENERIC = Recipe(
    tokens=65_536, val_tokens=4_096, seq_len=256, steps=400, batch_rows=8, lr=1e-3,
    warmup_steps=20, cls_stride=8,
)  # fmt: skip

RECIPES: dict[str, Recipe] = {
    # 384 prompts: 35 min of answers; 480 steps of 8 rows: 26 min (~10 epochs of the
    # 62k answer tokens; held-out top-1 0.374 at 240 steps, 0.428 at 480). ~62 min.
    "qwen2.5-coder-0.5b-instruct": Recipe(
        tokens=384 * 320,
        val_tokens=16 * 320,
        seq_len=320,
        steps=480,
        batch_rows=8,
        lr=1e-3,
        warmup_steps=20,
        cls_stride=8,
    ),  # fmt: skip
    # 160 prompts: 35 min of answers; 90 steps of 8 rows: 11.5 min (~4.5 epochs). 47 min,
    # run end to end; its curve still rose at the end, and ~170 more steps would fit.
    "qwen2.5-coder-1.5b-instruct": Recipe(
        tokens=160 * 320,
        val_tokens=8 * 320,
        seq_len=320,
        steps=90,
        batch_rows=8,
        lr=1e-3,
        warmup_steps=10,
        cls_stride=8,
        gen_batch=64,  # fp32 1.5B is ~7 GB already; 64 rows add ~1.2 GB of K/V
    ),  # fmt: skip
}


# EAGLE-3 recipes. The 0.5B one is sized for a loaded 2-core host (docs/results.md,
# "EAGLE-3 heads of our own"): 128 prompts answered in one batch, then
# 120 steps of 8 rows (~7 epochs) with a 4-step training-time test
# (~1.2 TFLOP a step: 4x the layer of an EAGLE-1 step), evaluated every 15 steps and
# checkpointed (eagle3_loop.py), so a later run resumes it with the same command (other
# sizes, --steps included, train afresh on the cached answers). D: 16k tokens, more than the answers use, which keeps the head's own LM head
# (the target's rows of D, frozen) at 29 MB.
EAGLE3_RECIPES: dict[str, Recipe] = {
    "qwen2.5-coder-0.5b-instruct": Recipe(
        tokens=128 * 320, val_tokens=16 * 320, seq_len=320, steps=120, batch_rows=8,
        lr=1e-3, warmup_steps=10, cls_stride=4, arch="eagle3", draft_vocab_size=16_384,
        unroll_steps=4,
    ),
}  # fmt: skip
EAGLE3_GENERIC = replace(GENERIC, arch="eagle3", unroll_steps=4, cls_stride=4)


def recipe_for(target: str, arch: str = "eagle1", **overrides: object) -> Recipe:
    """The recipe of registry name ``target`` for ``arch`` (the generic one otherwise), with
    non-None overrides."""
    if arch == "eagle3":
        base = EAGLE3_RECIPES.get(target, EAGLE3_GENERIC)
    else:
        base = RECIPES.get(target, GENERIC)
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})
