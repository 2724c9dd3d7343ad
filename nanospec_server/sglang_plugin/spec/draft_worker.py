"""Our draft workers: SGLang's EAGLE and STANDALONE draft workers with NanoSpec's LM head.

`EAGLEWorkerV2` (EAGLE, EAGLE3, NEXTN) and `StandaloneWorkerV2` look their draft-worker
class up as a module global, so `scheduler_hooks.py` swaps these subclasses in. Four methods
change (the LM head, the two draft extends, and `draft`, timed); everything else is
SGLang's own code path. Where draft kinds differ (EAGLE, EAGLE-3, STANDALONE), the worker
asks its `DraftKind` (`draft_kinds/`).
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.runtime_context import get_serving, get_spec
from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker
from sglang.srt.speculative.standalone_worker_v2 import StandaloneDraftWorker

from nanospec_server import env
from nanospec_server.config import Mode, NanoSpecConfig
from nanospec_server.sglang_plugin.spec import adaptive, step_context, tp_head
from nanospec_server.sglang_plugin.spec.draft_kinds.base import DraftKind
from nanospec_server.sglang_plugin.spec.draft_kinds.registry import draft_kind_for
from nanospec_server.sglang_plugin.spec.packed_head import PackedHeadLogitsProcessor
from nanospec_server.sglang_plugin.spec.runtime import NanoSpecRuntime
from nanospec_server.sglang_plugin.stats.request_stats import RequestStats
from nanospec_server.vocab import DynamicVocab
from nanospec_server.vocab.draft_vocab import DraftIds, DraftVocab
from nanospec_server.vocab.sharded_vocab import ShardedVocab
from nanospec_server.vocab.slot_pool import SlotPool

logger = logging.getLogger(__name__)


class NanoSpecDraftMixin:
    draft_kind: DraftKind
    token_map: torch.Tensor | None = None  # FR-Spec's list where hot_token_id is not it (TP)
    padding_columns: torch.Tensor | None = None  # TP token map: -1 on padding columns

    def init_lm_head(self) -> None:
        self.draft_kind = draft_kind_for(self.speculative_algorithm)
        sharded_map = tp_head.tp_size() > 1 and self.hot_token_id is not None
        if sharded_map and self.draft_kind.hot_tokens_are_token_map:
            # SGLang would index its local shard with global ids.
            self.token_map, self.hot_token_id = self.hot_token_id, None
        super().init_lm_head()
        if self.token_map is not None:
            self._shard_token_map()
        else:
            self.draft_kind.prepare_head(self)
        self.nanospec = _build_runtime(self)
        step_context.current().runtime = self.nanospec
        draft_model = self.draft_runner.model
        draft_model.logits_processor = PackedHeadLogitsProcessor(
            draft_model.logits_processor, self.nanospec, self.topk, self.padding_columns
        )
        if self.nanospec.vocab is not None:
            # SGLang maps every draft top-k through this table (FR-Spec's path), so local
            # rows of the packed head come back as token ids.
            self.hot_token_id = self.nanospec.vocab.row_token_ids
            self.draft_kind.install_prefill_candidates(self)

    def _shard_token_map(self) -> None:
        """The token map's rows of this rank's head shard, and the column table SGLang
        maps the gathered top-k through (``tp_head.shard_token_map``)."""
        model = self.draft_runner.model
        vocab_size = self.target_worker.model_runner.model_config.vocab_size
        layout = tp_head.layout_of(model.lm_head, vocab_size)
        rows, columns = tp_head.shard_token_map(model.lm_head.weight.data, layout, self.token_map)
        tp_head.replace_head_rows(model, rows)
        self.padding_columns = columns
        self.hot_token_id = columns.clamp(min=0)

    def _draft_extend_for_prefill(self, batch, target_hidden_states, next_token_ids, *args, **kw):
        own, top = self.draft_kind.own_prefill_candidates(batch)
        # the draft's prefill, and the top-K_pre unless the draft kind took its own in the
        # target's forward, wait for the request's first drafting step
        deferred = adaptive.prefill_deferred(batch)
        if own:
            self.nanospec.on_prefill(batch, None, top)
        elif deferred:
            self.nanospec.on_prefill(batch, target_hidden_states, defer_topk=True)
        elif adaptive.prefill_topk_skipped(batch):
            self.nanospec.on_prefill(batch, None)  # the prompt's tokens only
        else:
            self.nanospec.on_prefill(batch, target_hidden_states)
        if deferred:
            hidden = target_hidden_states
            stub = adaptive.skipped_draft_prefill(self, batch, next_token_ids, hidden)
            if stub is not None:
                return stub  # the draft catches up on the prompt before it drafts
        slots = batch.out_cache_loc
        with adaptive.widened_prefill(self, batch, target_hidden_states) as (widened, hidden):
            if widened:  # the target's plan covers the prefill's own slots only
                kw["kv_loc_plan"] = None
            target_hidden_states = self.draft_kind.draft_hidden_for_prefill(hidden)
            with adaptive.timed_draft_prefill(batch):
                result = super()._draft_extend_for_prefill(
                    batch, target_hidden_states, next_token_ids, *args, **kw
                )
        adaptive.draft_wrote(slots)
        return result

    def sglang_prefill_extend(self, batch, target_hidden_states, next_token_ids):
        """SGLang's own draft extend over a prefill-shaped batch, without ours around it
        (no window appends, no deferral, no widening): the catch-up's forward."""
        return super()._draft_extend_for_prefill(batch, target_hidden_states, next_token_ids)

    def draft(self, batch, *args, **kwargs):
        with self.nanospec.stats.timer.draft_phase(batch.req_pool_indices):
            return super().draft(batch, *args, **kwargs)

    def _draft_extend_for_decode(self, batch, batch_result, **kwargs):
        if adaptive.extend_skipped(batch, batch_result):
            return None  # a depth-0 step before another: SGLang's stub, our window update
        # the depth in force now: adaptive speculation switches it between steps
        plain = adaptive.plain_step_running()
        # A drafting step before another (a plain one before drafting: adaptive), unless it
        # is a probe: the batch most likely goes back to depth 0 after one, and the top-K_pre
        # of all its requests' prompts (a full-vocabulary LM head over each) would be spent
        # on nothing; the next drafting step appends them if the batch drafts on.
        if not plain and not adaptive.probing():
            self.nanospec.append_deferred_topk(batch)
        self.nanospec.on_verify(batch, batch_result, self.speculative_num_steps, plain)
        slots = batch.out_cache_loc
        with self.nanospec.stats.timer.draft_phase(batch.req_pool_indices):
            result = super()._draft_extend_for_decode(batch, batch_result, **kwargs)
        adaptive.draft_wrote(slots)
        return result


class NanoSpecEagleDraftWorker(NanoSpecDraftMixin, EagleDraftWorker):
    pass


class NanoSpecStandaloneDraftWorker(NanoSpecDraftMixin, StandaloneDraftWorker):
    pass


def _build_runtime(worker: EagleDraftWorker) -> NanoSpecRuntime:
    config = NanoSpecConfig.from_env()
    target_runner = worker.target_worker.model_runner
    vocab_size = target_runner.model_config.vocab_size
    num_slots = worker.req_to_token_pool.req_to_token.shape[0]
    device = target_runner.model.lm_head.weight.device
    stats = RequestStats(num_slots, vocab_size, device)
    vocab, slot_pool = None, None
    draft_ids = worker.draft_kind.draft_ids(worker)  # D of a head with its own vocabulary
    if problems := worker.draft_kind.refusals(worker, config):
        raise ValueError(problems[0])
    if config.mode.is_dynamic:
        _check_supported(config)
        vocab, slot_pool = build_vocab(worker, config, draft_ids)
        memory = vocab.memory_report()
        logger.info(
            "nanospec: %s mode, W_max=%d (cap %d), K_pre=%d, K_ver=%d, prior %d; device memory "
            "%.1f MiB: %d window slots x %.1f KiB + union head of %d rows %.1f MiB",
            config.mode.value, config.w_max, config.w_cap, config.k_pre, config.k_ver,
            config.prior_k,
            memory["total_bytes"] / 2**20, memory["slots"],
            memory["window_bytes_per_slot"] / 2**10, memory["union_capacity"],
            memory["union_bytes"] / 2**20,
        )  # fmt: skip
    elif config.mode == Mode.STATIC and worker.hot_token_id is None:
        raise ValueError("--nanospec-mode static needs --speculative-token-map (FR-Spec list)")
    target_head = target_runner.model.lm_head
    target_topk = None
    if tp_head.tp_size() > 1:  # each rank holds one shard of the target's head
        target_topk = tp_head.ShardedTopk(
            target_head.weight.data, tp_head.layout_of(target_head, vocab_size)
        )
    static_ids = worker.token_map if worker.token_map is not None else worker.hot_token_id
    runtime = NanoSpecRuntime(
        config=config,
        vocab_size=vocab_size,
        target_head=target_runner.model.lm_head.weight.data,
        stats=stats,
        vocab=vocab,
        slot_pool=slot_pool,
        # The fixed vocabulary the head drafts over: FR-Spec's list, or an EAGLE-3 head's D
        # (in full mode too: stock SGLang drafts over D there).
        static_ids=static_ids if not config.mode.is_dynamic else None,
        draft_head_vocab=draft_ids.draft_of >= 0 if draft_ids is not None else None,
        target_topk=target_topk,
    )
    runtime.update_settings()  # publish K_ver to the verify hook
    return runtime


def build_vocab(
    worker: EagleDraftWorker, config: NanoSpecConfig, draft_ids: DraftIds | None = None
) -> tuple[DynamicVocab, SlotPool]:
    """The vocabulary sized to the requests that can run at once, not to the request pool.
    With ``draft_ids`` (a pruned EAGLE-3 head) it drafts over I ∩ D (``DraftVocab``).

    SGLang's request pool can hold thousands of entries on a GPU; only
    ``max_running_requests`` of them run, so the O(V) window state has that many slots
    (plus padding slot 0) and a device map sends pool entries to them.
    """
    target_runner = worker.target_worker.model_runner
    max_running = max(int(target_runner.max_running_requests), 1)
    draft_head = worker.draft_runner.model.lm_head
    weight = draft_head.weight.data
    vocab_size = weight.shape[0]
    sharded = {}
    if tp_head.tp_size() > 1:  # the weight is this rank's shard of the head
        vocab_size = target_runner.model_config.vocab_size
        sharded = {"layout": tp_head.layout_of(draft_head, vocab_size)}
    eos = set(target_runner.model_config.hf_eos_token_id or ())
    pinned = sorted(eos.union(_prior_tokens(config.prior_k)))  # P of the hybrid vocabulary
    capacity = config.union_capacity
    if capacity is not None:  # the CLI cannot know V: clamp to what the head can hold
        capacity = max(min(capacity, vocab_size), len(pinned))
    vocab_class, head = (DynamicVocab, ()) if draft_ids is None else (DraftVocab, (draft_ids,))
    if sharded:
        vocab_class = ShardedVocab
    vocab = vocab_class(
        weight,
        *head,
        num_slots=max_running + 1,
        w_cap=config.w_cap,
        w_max=config.w_max,
        always_active=pinned,
        max_batch=max_running,
        overlap=config.mode != Mode.SYNC,
        union_capacity=capacity,
        # Fixed shapes (CUDA graphs) on CUDA; NANOSPEC_STATIC_SHAPES=1 forces them on CPU
        # too, where with TRITON_INTERPRET=1 the CUDA path's kernels serve (tests).
        static_shapes=True if env.static_shapes() else None,
        **sharded,
    )
    pool_size = worker.req_to_token_pool.req_to_token.shape[0]
    return vocab, SlotPool(pool_size, max_running + 1, vocab.device)


def _prior_tokens(k: int) -> list[int]:
    if k == 0:
        return []
    from transformers import AutoTokenizer

    from nanospec_server.vocab_tools.prior import prior_token_ids

    # The draft worker loads no tokenizer of its own; the target's is the one that counts.
    tokenizer = AutoTokenizer.from_pretrained(get_serving().tokenizer_path)
    return prior_token_ids(tokenizer, k)


def _check_supported(config: NanoSpecConfig) -> None:
    """What no draft kind serves in a dynamic mode (each kind's own refusals come first)."""
    if get_spec().speculative_use_rejection_sampling:
        raise ValueError(
            f"--nanospec-mode {config.mode.value} is incompatible with "
            "--speculative-use-rejection-sampling; without it, sampling verifies with the "
            "target's distribution alone, which stays exact."
        )


__all__ = ["NanoSpecEagleDraftWorker", "NanoSpecStandaloneDraftWorker"]
