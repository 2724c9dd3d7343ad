"""EAGLE-3 heads (``LlamaForCausalLMEagle3``, ``--speculative-algorithm EAGLE3``) in NanoSpec.

Two things differ from EAGLE-2, and both live here:

- **The draft vocabulary.** A SpecForge head with a d2t list drafts over D only (SGLang
  loads ``hot_token_id = d2t + arange``). ``full`` and ``static`` are then both stock
  SGLang over D; the dynamic modes draft over I ∩ D (``vocab/draft_vocab.py``). A head
  without d2t has the full vocabulary and runs as an EAGLE-2 head does.
- **Top-K_pre.** Under EAGLE-3 the target's ``CaptureHiddenMode.FULL`` carries the packed
  auxiliary hidden states, not the final one. ``PrefillTopk`` wraps the target's logits
  processor and takes the top-K_pre from the final normed hidden states at every prompt
  position there, inside the same target pass, just before SGLang keeps only the last
  position of each request. The draft worker hands them to ``on_prefill`` right after.
"""

from __future__ import annotations

from collections.abc import Callable

from sglang.srt.runtime_context import get_parallel
from torch import Tensor, nn

from nanospec_server.config import Mode, NanoSpecConfig
from nanospec_server.sglang_plugin.spec.draft_kinds.base import DraftKind
from nanospec_server.vocab import topk_tokens_in_chunks
from nanospec_server.vocab.draft_vocab import DraftIds


class Eagle3Kind(DraftKind):
    """SGLang's `hot_token_id` is the head's d2t (its D), never a token map."""

    name = "EAGLE3"
    algorithms = ("EAGLE3",)
    tiny_draft = "tiny-eagle3"
    hot_tokens_are_token_map = False

    def __init__(self) -> None:
        self.prefill_topk: PrefillTopk | None = None  # the source of top-K_pre, once installed

    def draft_ids(self, worker) -> DraftIds | None:
        return draft_ids(worker)

    def refusals(self, worker, config: NanoSpecConfig) -> list[str]:
        return refusals(worker, config)

    def install_prefill_candidates(self, worker) -> None:
        self.prefill_topk = install_prefill_topk(
            worker.target_worker.model_runner.model, worker.nanospec.prefill_k_pre
        )

    def own_prefill_candidates(self, batch) -> tuple[bool, Tensor | None]:
        # The hidden states the target hands over are the auxiliary ones, not the final.
        if self.prefill_topk is None:
            return False, None
        return True, prefill_top_for(batch, self.prefill_topk)


def draft_ids(worker) -> DraftIds | None:
    """D of an EAGLE-3 head with a d2t list (None: a full-vocabulary head)."""
    if worker.hot_token_id is None:
        return None
    vocab_size = worker.target_worker.model_runner.model_config.vocab_size
    return DraftIds.from_hot_token_ids(worker.hot_token_id, vocab_size)


def refusals(worker, config: NanoSpecConfig) -> list[str]:
    """What cannot work with this EAGLE-3 head, each naming the flag."""
    problems = []
    if config.mode == Mode.STATIC and worker.hot_token_id is None:
        problems.append(
            "--nanospec-mode static with an EAGLE-3 head drafts over the head's own d2t "
            "vocabulary, and this head has none (full vocabulary); SGLang ignores "
            "--speculative-token-map under --speculative-algorithm EAGLE3. Use "
            "--nanospec-mode full or a dynamic mode."
        )
    tp_size = get_parallel().tp_size
    if config.mode.is_dynamic and tp_size > 1:
        problems.append(
            f"--tp-size {tp_size}: --nanospec-mode {config.mode.value} with an EAGLE-3 head "
            "runs at --tp-size 1 only (its pruned draft vocabulary is not sharded); use "
            "--nanospec-mode full or static with it, or --tp-size 1"
        )
    return problems


class PrefillTopk(nn.Module):
    """The target's logits processor, keeping the top-K_pre of every prompt position.

    ``k_pre`` is read at each call, so a live change holds from the next prefill. Only
    prefill (extend) passes are looked at; verify passes go through untouched.
    """

    def __init__(self, inner: nn.Module, k_pre: Callable[[], int]) -> None:
        super().__init__()
        self.inner = inner
        self.k_pre = k_pre
        self.top: Tensor | None = None  # [extend tokens, K_pre] of the latest prefill

    def forward(self, input_ids, hidden_states, lm_head, forward_batch, *args, **kwargs):
        mode = getattr(forward_batch, "forward_mode", None)
        k = self.k_pre()
        if mode is not None and mode.is_extend() and not mode.is_target_verify() and k > 0:
            # Final normed hidden states of every position, before SGLang prunes them.
            self.top = topk_tokens_in_chunks(hidden_states, lm_head.weight, k)
        return self.inner(input_ids, hidden_states, lm_head, forward_batch, *args, **kwargs)

    def take(self) -> Tensor | None:
        top, self.top = self.top, None
        return top


def install_prefill_topk(target_model: nn.Module, k_pre: Callable[[], int]) -> PrefillTopk:
    """Wrap the target model's logits processor (once) and return the wrapper."""
    processor = target_model.logits_processor
    if not isinstance(processor, PrefillTopk):
        processor = PrefillTopk(processor, k_pre)
        target_model.logits_processor = processor
    return processor


def prefill_top_for(batch, capture: PrefillTopk) -> Tensor | None:
    """The captured top-K_pre if it belongs to this batch's prompt tokens."""
    top = capture.take()
    if top is None or top.shape[0] < sum(batch.extend_lens):
        return None
    return top


__all__ = ["Eagle3Kind", "PrefillTopk", "draft_ids", "install_prefill_topk", "refusals"]
