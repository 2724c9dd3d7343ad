"""The model `nanospec serve` runs when the user names none."""

from __future__ import annotations


def default_serve_argv() -> list[str]:
    """SGLang flags for the embedded default: the tiny offline models, EAGLE-drafted.

    Built on first use (a few seconds), so a fresh machine serves with no download.
    """
    from nanospec_server.models.tiny import tiny_model_path

    return [
        "--model-path", str(tiny_model_path("tiny-target")),
        "--speculative-algorithm", "EAGLE",
        "--speculative-draft-model-path", str(tiny_model_path("tiny-eagle")),
        "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4",
    ]  # fmt: skip
