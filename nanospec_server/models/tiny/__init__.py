"""Tiny offline test models (the test room; the real-model pipeline is the rest of ``models``).

``build``: builds and caches them; ``spec``: their shapes; ``weights``: the random and the
"agree" constructions; ``reference``: a plain forward pass to check SGLang against;
``tokenizer``: the shared byte-level BPE tokenizer trained on ``data/tiny_corpus.txt``.
"""

from nanospec_server.models.tiny.build import (
    TINY_MODELS,
    build_tiny_models,
    tiny_cache_root,
    tiny_model_path,
)

__all__ = ["TINY_MODELS", "build_tiny_models", "tiny_cache_root", "tiny_model_path"]
