"""The draft catches up lazily on the tokens it missed at depth 0.

A plain depth-0 step (`plain_step.py`) writes the target's KV and not the draft's: running
the draft extend on every such step would cost a draft forward per token that nobody
drafts from. Instead the draft's KV is tracked per KV slot (`valid`: set where the draft
wrote the slot along with the target, cleared where the target wrote it alone), and before
a step that drafts again, each request runs one batched draft extend over its positions
from the first whose draft KV is not valid to the step's token: the draft's prefill path,
fed the same tokens (and, for EAGLE and EAGLE-3, the target hidden states kept for those
positions) that the per-step extends would have fed it, so its KV and its next input are
what an exact per-step extend leaves (`--nanospec-adaptive-keep-extend`, the reference).

Slots are checked, not requests: a prefix the radix cache hands a new request may hold
positions another request decoded at depth 0, and they are caught up like its own. The
draft's KV at a position is computed from the token after it (SGLang's prefill rotation),
and at the last position of a shared prefix that token is the one of the request that
wrote the slot, not of the one that shares it: each slot the target writes alone keeps its
writer's next token (`rotated`), and the catch-up feeds the draft those. Requests of one
extend that share slots write them once (the first request that plans over them).

Bounds: at most ``chunk`` positions per request per step (a request with more stays at
depth 0, one chunk per step, until it is caught up), and at most ``cap`` kept hidden
states per request (EAGLE: older positions can no longer be caught up and keep the stale
draft KV: lossless still, the target verifies every draft token, only fewer accepted).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from torch import Tensor

CAP = 1024  # hidden states kept per request (EAGLE kinds)
CHUNK = 256  # positions a request catches up on per step

# The ScheduleBatch fields a widened prefill changes; put back after it.
_WIDENED = ("input_ids", "out_cache_loc", "prefix_lens", "extend_lens", "extend_num_tokens",
            "extend_logprob_start_lens")  # fmt: skip
# The ScheduleBatch fields the catch-up extend changes; put back after it.
_CHANGED = (
    "forward_mode", "input_ids", "out_cache_loc", "seq_lens", "seq_lens_cpu", "seq_lens_sum",
    "orig_seq_lens", "prefix_lens", "extend_lens", "extend_num_tokens",
    "extend_logprob_start_lens", "return_logprob", "spec_info", "chunked_req_next_prompt_token",
)  # fmt: skip


@dataclass
class KeptHidden:
    """The target hidden states of one request's positions ``first`` .. ``first + len - 1``."""

    first: int
    rows: list[Tensor] = field(default_factory=list)


@dataclass
class Plan:
    """Per request of the batch, the positions to run the draft over, ``start`` .. ``stop``,
    and its step's token's position ``end`` (``stop`` < ``end``: more chunks to go)."""

    start: list[int]
    stop: list[int]
    end: list[int]

    @property
    def done(self) -> bool:
        return self.stop == self.end

    @property
    def nothing_missed(self) -> bool:
        """Only the step's own token: the ordinary one-token draft extend does it."""
        return self.start == self.end


class DraftCatchUp:
    """Per-KV-slot draft validity, kept hidden states, and the catch-up extend."""

    def __init__(
        self, num_slots: int, device, keeps_hidden: bool, cap: int = CAP, chunk: int = CHUNK
    ) -> None:
        self.valid = torch.zeros(num_slots, dtype=torch.bool, device=device)
        # the draft's input at each slot the target wrote alone: its writer's next token
        self.rotated = torch.zeros(num_slots, dtype=torch.int64, device=device)
        self.keeps_hidden = keeps_hidden
        self.cap, self.chunk = cap, chunk
        self.kept: dict[str, KeptHidden] = {}
        self.tokens_caught_up = 0
        self.positions_left_stale = 0  # EAGLE: missed positions whose hidden state was gone
        self._stale_counted: dict[str, int] = {}  # per request, counted below this position

    # -- validity ------------------------------------------------------------------------

    def drafted(self, slots: Tensor) -> None:
        """The draft wrote these KV slots along with the target."""
        self.valid[slots.to(torch.int64)] = True

    def missed(self, batch, slots: Tensor, next_tokens: Tensor, hidden: Tensor | None) -> None:
        """The target alone wrote these slots (a depth-0 step), one per request of the batch,
        at its position ``seq_lens``, and decoded ``next_tokens`` after them; ``hidden``: the
        target's hidden state there."""
        slots = slots.to(torch.int64)
        self.valid[slots] = False
        self.rotated[slots] = next_tokens.to(torch.int64)
        if not self.keeps_hidden or hidden is None:
            return
        positions = batch.seq_lens.tolist()
        for req, position, row in zip(batch.reqs, positions, hidden, strict=True):
            kept = self.kept.get(req.rid)
            if kept is None or kept.first + len(kept.rows) != position:
                kept = self.kept[req.rid] = KeptHidden(position)  # a new run of misses
            kept.rows.append(row.clone())
            if len(kept.rows) > self.cap:
                kept.rows.pop(0)
                kept.first += 1

    def missed_prefill(self, batch, tails: Tensor) -> None:
        """The target alone prefilled the batch (its draft prefill skipped): each slot's next
        token is the prompt's, the last one's its request's ``tails`` entry."""
        rotated = torch.roll(batch.input_ids, -1)  # each request's last: its tail, below
        last = torch.tensor(batch.extend_lens, device=rotated.device).cumsum(0) - 1
        rotated[last] = tails.to(rotated.dtype)
        slots = batch.out_cache_loc.to(torch.int64)
        self.valid[slots] = False
        self.rotated[slots] = rotated.to(torch.int64)

    def _draft_inputs(self, slots: Tensor, own_next: list[int]) -> Tensor:
        """The tokens the draft is fed at these slots (rotated): where the draft's KV is
        valid, the request's own next tokens (``own_next``), where it is not, each slot's
        writer's (they differ only at the end of a prefix shared from another request)."""
        own = torch.tensor(own_next, dtype=torch.int64, device=slots.device)
        return torch.where(self.valid[slots], own, self.rotated[slots])

    def forget(self, live_rids: set[str]) -> None:
        """Drop the hidden states of requests no longer running."""
        for rid in [rid for rid in self.kept if rid not in live_rids]:
            del self.kept[rid]
        for rid in [rid for rid in self._stale_counted if rid not in live_rids]:
            del self._stale_counted[rid]

    # -- prefills ------------------------------------------------------------------------

    @contextmanager
    def widened_prefill(self, worker, batch) -> Iterator[bool]:
        """A prefill whose prefix (the radix cache's) holds positions the draft missed runs
        its draft extend from the first of them, for drafts that need only tokens
        (STANDALONE); an EAGLE draft would need the target's hidden states there, gone with
        the request that decoded them: those positions are counted as left stale."""
        prefix_lens = list(batch.prefix_lens)
        first = self._first_stale(worker, batch.req_pool_indices, prefix_lens)
        if all(start == prefix for start, prefix in zip(first, prefix_lens, strict=True)):
            yield False
            return
        if self.keeps_hidden:
            self.positions_left_stale += sum(p - s for s, p in zip(first, prefix_lens, strict=True))
            yield False
            return
        req_to_token = worker.req_to_token_pool.req_to_token
        tokens, slots, added, offset = [], [], [], 0
        rows = batch.req_pool_indices.tolist()
        for req, row, start, prefix, length in zip(
            batch.reqs, rows, first, prefix_lens, batch.extend_lens, strict=True
        ):
            sequence = req.origin_input_ids + req.output_ids
            prefix_slots = req_to_token[row, start:prefix].to(torch.int64)
            own = batch.input_ids[offset : offset + length]
            # SGLang's prefill rotates its input left by one: the first token is dropped,
            # the prefix's slots are fed their writers' next tokens, the prefill's own its
            # prompt's
            fed = self._draft_inputs(prefix_slots, list(sequence[start + 1 : prefix + 1]))
            tokens += [own[:1], fed.to(own.dtype), own[1:]]
            slots += [
                prefix_slots.to(batch.out_cache_loc.dtype),
                batch.out_cache_loc[offset : offset + length],
            ]
            added.append(prefix - start)
            offset += length
        saved = {name: getattr(batch, name) for name in _WIDENED}
        try:
            batch.input_ids = torch.cat(tokens).to(saved["input_ids"].dtype)
            batch.out_cache_loc = torch.cat(slots)
            batch.prefix_lens = first
            batch.extend_lens = [n + a for n, a in zip(saved["extend_lens"], added, strict=True)]
            batch.extend_num_tokens = sum(batch.extend_lens)
            batch.extend_logprob_start_lens = list(batch.extend_lens)
            yield True
        finally:
            for name, value in saved.items():
                setattr(batch, name, value)
        self.drafted(torch.cat(slots[0::2]))
        self.tokens_caught_up += sum(added)

    def _first_stale(self, worker, pool_rows: Tensor, ends: list[int]) -> list[int]:
        """Per request, its first position below ``ends`` whose draft KV is not valid (its
        ``ends`` entry if none)."""
        width = max(ends) if ends else 0
        if width == 0:
            return list(ends)
        req_to_token = worker.req_to_token_pool.req_to_token
        rows = pool_rows.to(torch.int64)
        limits = torch.tensor(ends, device=rows.device)
        columns = torch.arange(width, device=rows.device)
        stale = ~self.valid[req_to_token[rows, :width].to(torch.int64)]  # no whole rows copied
        stale &= columns[None, :] < limits[:, None]
        return torch.where(stale.any(1), stale.int().argmax(1), limits).tolist()

    # -- planning ------------------------------------------------------------------------

    def plan(self, worker, batch) -> Plan:
        """Each request's first position whose draft KV is not valid, up to its step's
        token (position ``seq_lens``), at most ``chunk`` of them; past the slots an earlier
        request of the batch plans over (a prefix they share: written once)."""
        ends = batch.seq_lens.tolist()
        first = self._first_stale(worker, batch.req_pool_indices, [end + 1 for end in ends])
        req_to_token = worker.req_to_token_pool.req_to_token
        planned: set[int] = set()
        starts, stops = [], []
        rows = batch.req_pool_indices.tolist()
        for req, row, start, end in zip(batch.reqs, rows, first, ends, strict=True):
            if self.keeps_hidden:  # positions without a kept hidden state stay stale
                reachable = self._reachable(req.rid, end)
                if start < reachable:
                    self._count_left_stale(req.rid, start, reachable)
                    start = reachable
            start = min(start, end)
            span = req_to_token[row, start : end + 1].tolist()
            skip = next((i for i, slot in enumerate(span) if slot not in planned), len(span))
            skip = min(skip, len(span) - 1)  # the step's own slot is never shared
            start += skip
            stop = min(end, start + self.chunk - 1)
            planned.update(span[skip : skip + stop - start + 1])
            starts.append(start)
            stops.append(stop)
        return Plan(starts, stops, ends)

    def owed(self, worker, batch) -> int:
        """The positions a catch-up would run the draft over, summed over the batch's
        requests, beyond the step's own token (what a per-step extend runs anyway); a
        prefix requests share counts once per request (the plan writes it once: a bound,
        read every step, without the plan's walk over each row). Changes nothing."""
        ends = batch.seq_lens.tolist()
        first = self._first_stale(worker, batch.req_pool_indices, ends)
        owed = 0
        for req, start, end in zip(batch.reqs, first, ends, strict=True):
            if self.keeps_hidden:  # positions without a kept hidden state stay stale
                start = max(start, self._reachable(req.rid, end))
            owed += max(end - start, 0)
        return owed

    def _reachable(self, rid: str, end: int) -> int:
        """An EAGLE draft's first position it can catch up on: its first kept hidden state
        (``end``, the step's own token, if none is kept)."""
        kept = self.kept.get(rid)
        return kept.first if kept is not None else end

    def _count_left_stale(self, rid: str, start: int, stop: int) -> None:
        """Positions ``start`` .. ``stop - 1`` of a request stay stale: count each once
        (every later plan skips them again)."""
        counted = self._stale_counted.get(rid, 0)
        self.positions_left_stale += max(0, stop - max(start, counted))
        self._stale_counted[rid] = max(counted, stop)

    # -- the extend ----------------------------------------------------------------------

    def run(self, worker, batch, plan: Plan, next_ids: Tensor):
        """One draft extend over each request's planned positions (the draft's prefill
        path); returns its next draft input (meaningful where the plan reached the step's
        token). The draft's KV at every planned position becomes valid."""
        draft = worker.draft_worker
        req_to_token = worker.req_to_token_pool.req_to_token
        device = batch.seq_lens.device
        tokens, slots, hidden, lengths, tails = [], [], [], [], []
        pool_rows = batch.req_pool_indices.tolist()
        new_ids = next_ids.tolist()
        spans = zip(batch.reqs, pool_rows, plan.start, plan.stop, plan.end, strict=True)
        for i, (req, row, start, stop, end) in enumerate(spans):
            sequence = req.origin_input_ids + req.output_ids  # positions 0 .. end
            span = req_to_token[row, start : stop + 1].to(torch.int64)
            # after the last planned position: the step's new token, or the next of the
            # request's own sequence when more chunks are to go
            after = new_ids[i] if stop == end else sequence[stop + 1]
            fed = self._draft_inputs(span, [*sequence[start + 1 : stop + 1], after])
            # SGLang's prefill rotates its input left by one and appends the tail
            tokens += [torch.tensor(sequence[start : start + 1], device=device), fed[:-1]]
            tails.append(fed[-1:])
            slots.append(span)
            lengths.append(stop - start + 1)
            if self.keeps_hidden:
                kept = self.kept[req.rid]
                hidden.extend(kept.rows[start - kept.first : stop - kept.first + 1])
                del kept.rows[: stop + 1 - kept.first]  # caught up: no longer needed
                kept.first = stop + 1
        saved = {name: getattr(batch, name) for name in _CHANGED}
        try:
            batch.forward_mode = ForwardMode.EXTEND
            batch.input_ids = torch.cat(tokens)
            batch.out_cache_loc = torch.cat(slots)
            batch.prefix_lens = list(plan.start)
            batch.extend_lens = lengths
            batch.extend_num_tokens = sum(lengths)
            batch.extend_logprob_start_lens = list(lengths)
            ends = [start + n for start, n in zip(plan.start, lengths, strict=True)]
            batch.seq_lens = torch.tensor(ends, dtype=saved["seq_lens"].dtype, device=device)
            batch.seq_lens_cpu = batch.seq_lens.cpu()
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
            batch.orig_seq_lens = batch.seq_lens
            batch.return_logprob = False
            batch.chunked_req_next_prompt_token = None
            states = torch.stack(hidden) if hidden else None
            states = draft.draft_kind.draft_hidden_for_prefill(states)
            tail = torch.cat(tails)
            draft_input = draft.sglang_prefill_extend(batch, states, tail)
        finally:
            for name, value in saved.items():
                setattr(batch, name, value)
        self.drafted(torch.cat(slots))
        self.tokens_caught_up += sum(lengths)
        return draft_input, torch.tensor(lengths, dtype=torch.int64, device=device)
