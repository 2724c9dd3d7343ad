"""NanoSpec's per-scheduler state and the two moments it changes in a speculative step.

    prefill:  S = prompt tokens, then the target's top-K_pre at every prompt position
    verify:   S += every draft-tree token, then the target's top-K_ver at each accepted
              position; refresh the packed head (on a side stream on CUDA) before the
              draft-extend pass, whose LM head waits for it
    draft:    the draft's LM head runs over the packed rows; `packed_head.py` masks each
              request to its own active set

One runtime lives in each scheduler process (`step_context.current().runtime`): the draft
worker creates it, the output streamer and the internal-state handlers read it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from torch import Tensor

from nanospec_server.config import Mode, NanoSpecConfig, requested_w_max
from nanospec_server.sglang_plugin.spec.verify_capture import LAST_VERIFY, VerifyCandidates
from nanospec_server.sglang_plugin.stats.request_stats import RequestStats
from nanospec_server.sglang_plugin.stats.stream_recorder import StreamRecorder
from nanospec_server.vocab import DynamicVocab, topk_tokens_in_chunks
from nanospec_server.vocab.slot_pool import SlotPool

logger = logging.getLogger(__name__)


@dataclass
class SlotOwner:
    req: object  # SGLang's Req: its rid, whether it finished, which pool entry it holds
    prompt_tokens_appended: int = 0
    # The target's hidden states at prompt positions whose top-K_pre wait for the request's
    # first drafting step (a server that catches up defers them: most requests under load
    # never draft), at most the last W_max / K_pre positions (earlier ones would leave the
    # window at once), and the window entries appended after the prompt since.
    deferred_hidden: list[Tensor] = field(default_factory=list)
    entries_after_prompt: int = 0

    @property
    def rid(self) -> str:
        return self.req.rid


@dataclass
class NanoSpecRuntime:
    config: NanoSpecConfig
    vocab_size: int
    target_head: Tensor  # [V, d] the target's LM head, for top-K_pre
    stats: RequestStats
    vocab: DynamicVocab | None  # None in the full and static modes
    # Request-pool index -> vocabulary slot (the vocabulary holds running requests only).
    slot_pool: SlotPool | None = None
    static_ids: Tensor | None = None  # the head's fixed vocabulary (static; EAGLE-3's D)
    # [V] bool: D of a pruned EAGLE-3 head (None: the head has every token), for coverage.
    draft_head_vocab: Tensor | None = None
    owners: dict[int, SlotOwner] = field(default_factory=dict)  # by request-pool index
    # The pool entries holding a vocabulary slot now, and whose request holds it.
    holders: dict[int, SlotOwner] = field(default_factory=dict)
    requests_without_slot: int = 0  # admitted when every vocabulary slot was taken
    # The output streamer may see a finished request after SGLang released its slot.
    slot_of_rid: dict[str, int] = field(default_factory=dict)
    recorder: StreamRecorder | None = field(default_factory=StreamRecorder.from_env)
    # (hidden, k) -> the target's top-k token ids, where ``target_head`` is one TP shard.
    target_topk: Callable[[Tensor, int], Tensor] | None = None
    deferring: set[int] = field(default_factory=set)  # pool entries with deferred top-K_pre

    @property
    def mode(self) -> Mode:
        return self.config.mode

    def update_settings(self, **changes: int) -> None:
        """Live W_max / K_pre / K_ver: validated as a whole, effective at the next step.
        A live W_max reaches the requests that did not ask for their own, running ones too."""
        self.config = NanoSpecConfig.model_validate(self.config.model_dump() | changes)
        if self.vocab is not None:
            self.vocab.set_w_max(self.config.w_max)
        LAST_VERIFY.k_ver = self.config.k_ver if self._appends_while_decoding() else 0

    # -- prefill ------------------------------------------------------------------------

    def prefill_k_pre(self) -> int:
        """K_pre where prefill candidates enter a window (0: none are needed)."""
        return self.config.k_pre if self.vocab is not None and self.mode != Mode.EXT_ONLY else 0

    def on_prefill(
        self,
        batch,
        target_hidden: Tensor | None,
        prefill_top: Tensor | None = None,
        defer_topk: bool = False,
    ) -> None:
        """``prefill_top``: the top-K_pre already taken in the target pass (EAGLE-3), else
        they come from ``target_hidden``, now or (``defer_topk``) at the request's first
        drafting step (``append_deferred_topk``)."""
        self.release_ended()
        if not batch.reqs:
            return
        pool_slots = batch.req_pool_indices.to(torch.int64)
        self._claim_slots(batch.reqs, pool_slots)
        if self.vocab is None or self.mode == Mode.EXT_ONLY:
            return
        slots = self.vocab_slots(pool_slots)
        prompt_rows = []
        for req, prefix_len, extend_len in zip(
            batch.reqs, batch.prefix_lens, batch.extend_lens, strict=True
        ):
            owner = self.owners[req.kv.req_pool_idx]
            end = prefix_len + extend_len
            prompt_rows.append(_fill_ids(req)[owner.prompt_tokens_appended : end])
            owner.prompt_tokens_appended = end
        rids = [req.rid for req in batch.reqs]
        self._append(slots, *_padded(prompt_rows, slots.device), rids, "prefill")
        if defer_topk and target_hidden is not None and self.config.k_pre > 0:
            self._defer_topk(batch, target_hidden)
        elif prefill_top is None and target_hidden is not None and self.config.k_pre > 0:
            prefill_top = self._target_topk(target_hidden, self.config.k_pre)
        if prefill_top is not None:
            rows = _per_request_rows(prefill_top, batch.extend_lens)
            self._append(slots, *rows, rids, "prefill")
        self.vocab.refresh(slots)

    def _defer_topk(self, batch, target_hidden: Tensor) -> None:
        offset = 0
        for req, length in zip(batch.reqs, batch.extend_lens, strict=True):
            owner = self.owners[req.kv.req_pool_idx]
            owner.deferred_hidden.append(target_hidden[offset : offset + length].clone())
            offset += length
            keep = -(-self.w_max_in_force(req) // self.config.k_pre)
            while sum(len(rows) for rows in owner.deferred_hidden[1:]) >= keep:
                owner.deferred_hidden.pop(0)  # wholly outside the window once appended
            self.deferring.add(req.kv.req_pool_idx)

    def append_deferred_topk(self, batch) -> None:
        """The top-K_pre deferred at these requests' prefills enter their windows now,
        before the draft's LM head runs for them: as many of the latest as the stream in
        its own order (prompt, top-K_pre, steps) would still hold in the last W_max
        entries, so the active set is the one a top-K_pre taken at prefill leaves (they
        are the newest entries now, not the oldest: later steps evict others first)."""
        if not self.deferring:
            return
        owners = [self.owners.get(req.kv.req_pool_idx) for req in batch.reqs]
        ready = [
            (row, owner)
            for row, (req, owner) in enumerate(zip(batch.reqs, owners, strict=True))
            if owner is not None and owner.rid == req.rid and owner.deferred_hidden
        ]
        if not ready:
            return
        k = self.config.k_pre
        rows, rooms, hidden = [], [], []
        for row, owner in ready:
            room = self.w_max_in_force(owner.req) - owner.entries_after_prompt
            if room > 0:
                positions = -(-room // k)  # the last ones whose entries still have room
                rows.append(row)
                rooms.append(room)
                hidden.append(torch.cat(owner.deferred_hidden)[-positions:])
        if rows:
            top = self._target_topk(torch.cat(hidden), k).view(-1).tolist()
            tokens, offset = [], 0
            for room, states in zip(rooms, hidden, strict=True):
                entries = top[offset : offset + k * len(states)]  # position-major, rank order
                tokens.append(entries[-room:])
                offset += k * len(states)
            index = torch.tensor(rows, device=batch.req_pool_indices.device)
            slots = self.vocab_slots(batch.req_pool_indices[index].to(torch.int64))
            rids = [batch.reqs[row].rid for row in rows]
            self._append(slots, *_padded(tokens, slots.device), rids, "prefill")
            self.vocab.refresh(slots)
        for _, owner in ready:
            owner.deferred_hidden.clear()
            self.deferring.discard(owner.req.kv.req_pool_idx)

    def _count_after_prompt(self, reqs, appended: Tensor) -> None:
        """Window entries these requests got since their prompts, while a top-K_pre waits."""
        for req, count in zip(reqs, appended.tolist(), strict=True):
            owner = self.owners.get(req.kv.req_pool_idx)
            if owner is not None and owner.deferred_hidden:
                owner.entries_after_prompt += count

    def _target_topk(self, hidden: Tensor, k: int) -> Tensor:
        if self.target_topk is not None:
            return self.target_topk(hidden, k)
        return topk_tokens_in_chunks(hidden, self.target_head, k)

    def _claim_slots(self, reqs, pool_slots: Tensor) -> None:
        """Reset the slots that a new request took over (pool entries are reused), and
        give each new request a vocabulary slot."""
        fresh, fresh_vocab, own_w_max = [], [], []
        for req in reqs:
            slot = req.kv.req_pool_idx
            owner = self.owners.get(slot)
            if owner is None or owner.rid != req.rid:
                if owner is not None:
                    self.slot_of_rid.pop(owner.rid, None)
                    self._release_vocab_slot(slot)
                self.owners[slot] = SlotOwner(req)
                self.slot_of_rid[req.rid] = slot
                fresh.append(slot)
                if self.slot_pool is not None:
                    fresh_vocab.append(self._claim_vocab_slot(slot))
                    own_w_max.append(self._own_w_max(req) or 0)
                    if fresh_vocab[-1]:
                        self.holders[slot] = self.owners[slot]
        if fresh:
            fresh_slots = torch.tensor(fresh, dtype=torch.int64, device=pool_slots.device)
            self.stats.reset(fresh_slots)
        if self.vocab is not None and any(fresh_vocab):
            claimed = [(s, w) for s, w in zip(fresh_vocab, own_w_max, strict=True) if s]
            vocab_slots = torch.tensor([s for s, _ in claimed], device=pool_slots.device)
            self.vocab.reset(vocab_slots)
            # A request's own W_max holds for its whole life, over any live change.
            if any(w for _, w in claimed):
                self.vocab.set_request_w_max(vocab_slots, [w for _, w in claimed])

    def _own_w_max(self, req) -> int | None:
        """The W_max a request asked for (checked with a 400 by the tokenizer manager;
        bounded again here so that no path can push a window past its ring)."""
        own = requested_w_max(req.sampling_params.custom_params)
        return min(own, self.config.w_cap) if own else None

    def w_max_in_force(self, req) -> int | None:
        """The W_max of this request's window: its own, else the live one (None: no window)."""
        if self.vocab is None:
            return None
        return self._own_w_max(req) or self.config.w_max

    def _claim_vocab_slot(self, pool_index: int) -> int:
        slot = self.slot_pool.claim(pool_index)
        if slot == 0:  # every slot taken: reclaim those of requests that left the pool
            self.release_ended()
            slot = self.slot_pool.claim(pool_index)
        if slot == 0:  # still none: this request drafts from the always-active tokens only
            self.requests_without_slot += 1
        return slot

    def _release_vocab_slot(self, pool_index: int) -> None:
        self.holders.pop(pool_index, None)
        if self.slot_pool is not None and (slot := self.slot_pool.release(pool_index)):
            self.vocab.reset(torch.tensor([slot], device=self.slot_pool.table.device))

    def release_ended(self) -> None:
        """Give back the vocabulary slots (window, union rows) of requests that ended,
        finished, aborted or retracted, so that a finished request's tokens stop costing
        the live ones LM-head rows. Called where no batch can still read those slots: at
        the start of a step (in stream order with the last one) and when the scheduler
        idles; a request that finishes is emitted first, so its last snapshot sees them."""
        ended = [
            index
            for index, owner in self.holders.items()
            if owner.req.finished() or owner.req.kv.req_pool_idx != index
        ]
        # A request can end without its last chunk reaching our streamer (an abort):
        # file it while its window still reads as it was.
        reqs = [self.holders[index].req for index in ended]
        unfiled = [req for req in reqs if req.finished() and req.rid in self.stats.running]
        if unfiled:
            self.snapshot(unfiled)
        for index in ended:
            self.holders[index].deferred_hidden.clear()
            self.deferring.discard(index)
            self._release_vocab_slot(index)

    def vocab_slots(self, pool_slots: Tensor) -> Tensor:
        """Vocabulary slots of these request-pool entries (device lookup, graph-safe)."""
        return self.slot_pool.lookup(pool_slots) if self.slot_pool is not None else pool_slots

    # -- verify -------------------------------------------------------------------------

    def on_verify(self, batch, batch_result, depth: int, plain: bool = False) -> None:
        """After a verify of ``depth`` draft steps (0: a plain decode, adaptive speculation;
        ``plain``: one that ran SGLang's plain decode path, not a verify)."""
        candidates = LAST_VERIFY.take()
        self.release_ended()
        if not batch.reqs:
            return
        pool_slots = batch.req_pool_indices.to(torch.int64)
        slots = self.vocab_slots(pool_slots)
        if plain:  # nothing drafted: no coverage to count (the active set's size costs a scan)
            self.stats.record_plain(pool_slots)
        else:
            self._record_verify(pool_slots, slots, batch_result, depth)
        rids = [req.rid for req in batch.reqs]
        if candidates is not None and self._appends_while_decoding():
            # A plain step's entries wait for the next read of the window (a drafting step,
            # a snapshot): most runs of plain steps end without one.
            appended = self._append_step(slots, candidates, rids, batch.seq_lens, later=plain)
            if self.deferring:
                self._count_after_prompt(batch.reqs, appended)
            if not plain:
                self.vocab.refresh(slots)
        elif candidates is not None and self.vocab is None and self.recorder is not None:
            self._append_step(slots, candidates, rids, batch.seq_lens)  # recorded only

    def _record_verify(self, pool_slots: Tensor, slots: Tensor, batch_result, depth: int) -> None:
        accept_lens = batch_result.accept_lens.to(torch.int64)
        emitted = batch_result.next_token_ids.view(len(slots), -1).to(torch.int64)
        emitted_valid = torch.arange(emitted.shape[1], device=slots.device) < accept_lens[:, None]
        covered = (self._in_draft_vocab(slots, emitted) & emitted_valid).sum(1)
        in_head = emitted_valid
        if self.draft_head_vocab is not None:
            vocab_size = len(self.draft_head_vocab)  # padding past accept_lens may be any id
            in_head = in_head & self.draft_head_vocab[emitted.clamp(0, vocab_size - 1)]
        active = self._active_size(slots)
        self.stats.record_verify(pool_slots, accept_lens, covered, active, in_head.sum(1), depth)

    def _append_step(
        self,
        slots: Tensor,
        candidates: VerifyCandidates,
        rids: list[str],
        roots: Tensor,
        later: bool = False,
    ) -> Tensor:
        """Appends a step's entries (``later``: with their refresh, when next read,
        ``DynamicVocab.append_later``); returns how many each request got."""
        # Order within a step (it decides eviction): the draft tree, root first, then the
        # verify top-K_ver position by position, rank by rank. Later entries live longer.
        top = candidates.top_tokens.flatten(1)
        tokens = torch.cat([candidates.tree_tokens.to(torch.int64), top], dim=1)
        tree_valid = torch.ones_like(candidates.tree_tokens, dtype=torch.bool)
        valid = torch.cat([tree_valid, candidates.top_valid.flatten(1)], dim=1)
        tree_size = candidates.tree_tokens.shape[1]
        self._append(slots, tokens, valid, rids, "step", roots, tree_size, later)
        return valid.sum(1)

    def _append(
        self,
        slots: Tensor,
        tokens: Tensor,
        valid: Tensor,
        rids: list[str],
        kind: str,
        roots: Tensor | None = None,
        tree_size: int | None = None,
        later: bool = False,
    ) -> None:
        if self.vocab is not None and later:
            self.vocab.append_later(slots, tokens, valid)
        elif self.vocab is not None:  # without one (full, static) the step is only recorded
            self.vocab.append(slots, tokens, valid)
        if self.recorder is not None:
            positions = roots.tolist() if roots is not None else None
            self.recorder.record(rids, kind, tokens, valid, positions, tree_size)

    def _appends_while_decoding(self) -> bool:
        return self.vocab is not None and self.mode != Mode.CTX_ONLY

    # -- what the draft head can propose ------------------------------------------------

    def _in_draft_vocab(self, slots: Tensor, tokens: Tensor) -> Tensor:
        if self.vocab is not None:
            return self.vocab.contains(slots, tokens)
        if self.static_ids is not None:
            return torch.isin(tokens, self.static_ids)
        return torch.ones_like(tokens, dtype=torch.bool)

    def _active_size(self, slots: Tensor) -> Tensor:
        if self.vocab is not None:
            return self.vocab.active_size(slots)
        size = self.vocab_size if self.static_ids is None else len(self.static_ids)
        return torch.full_like(slots, size)

    # -- host snapshots (one copy per output chunk) ---------------------------------------

    def snapshot(self, reqs) -> list[dict]:
        slots = [self.slot_of_rid.get(req.rid, 0) for req in reqs]
        index = torch.tensor(slots, dtype=torch.int64, device=self.stats.counters.device)
        if self.vocab is not None:
            index = torch.tensor([self.slot_pool.slot_of(s) for s in slots], device=index.device)
            active = self.vocab.active_size(index).tolist()
            length = self.vocab.stream_length(index).tolist()
        else:
            active, length = self._active_size(index).tolist(), [0] * len(slots)
        stats = self.stats.snapshot(slots, active, length)
        for req, req_stats in zip(reqs, stats, strict=True):
            req_stats["mode"] = self.mode.value
            req_stats["w_max"] = self.w_max_in_force(req)
            if req.finished():
                aborted = isinstance(req.finished_reason, FINISH_ABORT)
                self.stats.remember_finished(req.rid, req_stats, aborted)
        return stats

    def memory_report(self) -> dict:
        """NanoSpec's device bytes and how a full union buffer degraded drafting (for
        /stats/vocab; reads two device counters)."""
        if self.vocab is None:
            held = ("slots_in_use", "union_rows_in_use", "union_rows_idle")
            return dict.fromkeys(
                ("total_bytes", *held, "state_bytes_in_use", "state_bytes_idle"), 0
            )
        report = self.vocab.memory_report() | self.vocab.overflow_stats()
        report["slot_map_bytes"] = self.slot_pool.table.numel() * 8 if self.slot_pool else 0
        report["total_bytes"] += report["slot_map_bytes"]
        report["requests_without_slot"] = self.requests_without_slot
        # What requests hold of it now: with none running, the pinned rows only.
        report |= self.vocab.usage()
        report["slots_in_use"] = len(self.holders)
        in_use = report["slots_in_use"] * report["window_bytes_per_slot"]
        in_use += report["union_rows_in_use"] * report["union_bytes_per_row"]
        report["state_bytes_in_use"] = in_use
        report["state_bytes_idle"] = report["union_rows_idle"] * report["union_bytes_per_row"]
        return report


def _fill_ids(req) -> list[int]:
    return list(req.origin_input_ids) + list(req.output_ids)


def _padded(rows: list[list[int]], device: torch.device) -> tuple[Tensor, Tensor]:
    width = max((len(r) for r in rows), default=0)
    tokens = torch.zeros(len(rows), width, dtype=torch.int64)
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row, dtype=torch.int64)
        valid[i, : len(row)] = True
    return tokens.to(device), valid.to(device)


def _per_request_rows(top: Tensor, extend_lens: list[int]) -> tuple[Tensor, Tensor]:
    """[sum(extend_lens), K] candidates -> [B, max_len * K] rows, position-major."""
    device, k = top.device, top.shape[1]
    lens = torch.tensor(extend_lens, dtype=torch.int64, device=device)
    starts = torch.cumsum(lens, 0) - lens
    width = max(extend_lens)
    offsets = torch.arange(width, device=device)
    rows = (starts[:, None] + offsets).clamp(max=top.shape[0] - 1)
    valid = (offsets < lens[:, None]).unsqueeze(-1).expand(-1, -1, k)
    return top[rows].flatten(1), valid.flatten(1)
