"""DraftKind: what one draft kind does its own way inside our draft worker, with the
defaults EAGLE's head takes. A new kind is one module with a subclass, registered in
``registry.py``."""

from __future__ import annotations

from typing import ClassVar

from torch import Tensor

from nanospec_server.config import NanoSpecConfig
from nanospec_server.vocab.draft_vocab import DraftIds


class DraftKind:
    """One instance per draft worker (a kind may keep per-worker state), asked at the
    moments the worker differs by kind: head preparation, vocabulary, refusals at start,
    prefill candidates and the depths adaptive speculation chooses among."""

    name: ClassVar[str]
    algorithms: ClassVar[tuple[str, ...]]  # SGLang's SpeculativeAlgorithm names it serves
    tiny_draft: ClassVar[str]  # its tiny test model (models/tiny/spec.py)
    # SGLang's `hot_token_id` is FR-Spec's --speculative-token-map (not the head's own
    # vocabulary): under TP it is sharded with the head, and dynamic modes refuse it.
    hot_tokens_are_token_map: ClassVar[bool] = True

    def prepare_head(self, worker) -> None:
        """After SGLang's `init_lm_head` (no token map to shard): make the draft head the
        one SGLang maps its top-k through."""

    def draft_ids(self, worker) -> DraftIds | None:
        """The head's own draft vocabulary D (dynamic modes then draft over I ∩ D with
        `DraftVocab`), or None: the whole vocabulary (`DynamicVocab`)."""
        return None

    def refusals(self, worker, config: NanoSpecConfig) -> list[str]:
        """What this kind cannot serve under ``config``, each a message naming the flag."""
        if config.mode.is_dynamic and worker.hot_token_id is not None:
            return [
                f"--nanospec-mode {config.mode.value} drafts over its own vocabulary and "
                "cannot be combined with --speculative-token-map (FR-Spec's fixed list). Use "
                "--nanospec-mode static with it, or drop the token map."
            ]
        return []

    def install_prefill_candidates(self, worker) -> None:
        """Once the dynamic vocabulary exists: whatever top-K_pre at prefill needs."""

    def own_prefill_candidates(self, batch) -> tuple[bool, Tensor | None]:
        """(True, top-K_pre) where this kind takes them itself (None: the prompt's tokens
        only); (False, None) where they come from the target's hidden states."""
        return False, None

    def draft_hidden_for_prefill(self, target_hidden_states: Tensor | None) -> Tensor | None:
        """The hidden states the draft's prefill extend gets from the target's."""
        return target_hidden_states

    def candidate_depths(self, deepest: int, topk: int) -> list[int]:
        """Every depth up to the launch's for a chain (top-k 1); for a tree, drafting on or
        off (its node budget is tuned for the full depth; shallower trees would need their
        own)."""
        return list(range(deepest + 1)) if topk == 1 else [0, deepest]
