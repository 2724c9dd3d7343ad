"""The dynamic draft vocabulary (NanoSpec, Section 3.2): window state and packed LM head.

A library of its own: it imports torch only (no SGLang), and runs on CPU.
"""

from nanospec_server.vocab.candidates import topk_tokens_in_chunks
from nanospec_server.vocab.dynamic_vocab import DynamicVocab

__all__ = ["DynamicVocab", "topk_tokens_in_chunks"]
