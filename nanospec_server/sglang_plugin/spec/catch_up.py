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

EAGLE and EAGLE-3 drafts read the target's hidden state at each position: it is kept per KV
slot too (`hidden`), beside the writer's next token, wherever the target writes a slot
alone (a depth-0 step, a prefill whose draft prefill was skipped), so a prefix from the
radix cache is caught up whoever decoded it. A slot without one (none was captured) cannot
be caught up: the catch-up starts past it and counts the positions it leaves stale
(lossless still, the target verifies every draft token, only fewer accepted).

Bound: at most ``chunk`` positions per request per step (a request with more stays at
depth 0, one chunk per step, until it is caught up).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from torch import Tensor

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
    """Per-KV-slot draft validity, the draft's inputs kept there, and the catch-up extend."""

    def __init__(self, num_slots: int, device, keeps_hidden: bool, chunk: int = CHUNK) -> None:
        self.num_slots = num_slots
        self.valid = torch.zeros(num_slots, dtype=torch.bool, device=device)
        # the draft's input at each slot the target wrote alone: its writer's next token
        self.rotated = torch.zeros(num_slots, dtype=torch.int64, device=device)
        self.keeps_hidden = keeps_hidden
        # EAGLE kinds: the target's hidden state at each slot it wrote alone, allocated at
        # the first one kept (its width and dtype are the target's); a CPU maps a buffer
        # this large lazily, so it holds memory only for the slots written
        self.hidden: Tensor | None = None
        self.has_hidden = torch.zeros(num_slots, dtype=torch.bool, device=device)
        self.chunk = chunk
        self.tokens_caught_up = 0
        self.positions_left_stale = 0  # EAGLE: missed positions without a hidden state
        self._stale_counted: dict[str, int] = {}  # per request, counted below this position

    # -- validity ------------------------------------------------------------------------

    def drafted(self, slots: Tensor) -> None:
        """The draft wrote these KV slots along with the target."""
        self.valid.index_fill_(0, slots.to(torch.int64), True)

    def missed(self, batch, slots: Tensor, next_tokens: Tensor, hidden: Tensor | None) -> None:
        """The target alone wrote these slots (a depth-0 step), one per request of the batch,
        and decoded ``next_tokens`` after them; ``hidden``: the target's hidden states
        there."""
        slots = slots.to(torch.int64)
        self.valid.index_fill_(0, slots, False)
        self.rotated.index_copy_(0, slots, next_tokens.to(torch.int64))
        self._keep_hidden(slots, hidden)

    def missed_prefill(self, batch, tails: Tensor, hidden: Tensor | None = None) -> None:
        """The target alone prefilled the batch (its draft prefill skipped): each slot's next
        token is the prompt's, the last one's its request's ``tails`` entry; ``hidden``: the
        target's hidden state at every position (EAGLE kinds)."""
        rotated = torch.roll(batch.input_ids, -1)  # each request's last: its tail, below
        last = torch.tensor(batch.extend_lens, device=rotated.device).cumsum(0) - 1
        rotated[last] = tails.to(rotated.dtype)
        slots = batch.out_cache_loc.to(torch.int64)
        self.valid.index_fill_(0, slots, False)
        self.rotated.index_copy_(0, slots, rotated.to(torch.int64))
        self._keep_hidden(slots, hidden)

    def hidden_complete(self, hidden: Tensor | None, count: int) -> bool:
        """Whether ``hidden`` holds the target's hidden state at each of ``count`` positions,
        or the draft needs none (STANDALONE)."""
        return not self.keeps_hidden or (hidden is not None and hidden.shape[0] == count)

    def _keep_hidden(self, slots: Tensor, hidden: Tensor | None) -> None:
        if not self.keeps_hidden:
            return
        if not self.hidden_complete(hidden, slots.shape[0]):
            self.has_hidden.index_fill_(0, slots, False)
            return
        if self.hidden is None:
            shape = (self.num_slots, *hidden.shape[1:])
            self.hidden = torch.empty(shape, dtype=hidden.dtype, device=hidden.device)
        # index_copy_ / index_fill_ rather than indexed assignment (the generic index_put_,
        # dearer on a CPU), on every depth-0 step; a step's slots are distinct.
        self.hidden.index_copy_(0, slots, hidden.to(self.hidden.dtype))
        self.has_hidden.index_fill_(0, slots, True)

    def _draft_inputs(self, slots: Tensor, own_next: list[int]) -> Tensor:
        """The tokens the draft is fed at these slots (rotated): where the draft's KV is
        valid, the request's own next tokens (``own_next``), where it is not, each slot's
        writer's (they differ only at the end of a prefix shared from another request)."""
        own = torch.tensor(own_next, dtype=torch.int64, device=slots.device)
        return torch.where(self.valid[slots], own, self.rotated[slots])

    def forget(self, live_rids: set[str]) -> None:
        """Drop what is kept about requests no longer running."""
        for rid in [rid for rid in self._stale_counted if rid not in live_rids]:
            del self._stale_counted[rid]

    # -- prefills ------------------------------------------------------------------------

    @contextmanager
    def widened_prefill(
        self, worker, batch, hidden: Tensor | None
    ) -> Iterator[tuple[bool, Tensor | None]]:
        """A prefill whose prefix (the radix cache's) holds positions the draft missed runs
        its draft extend from the first of them: yields whether it widened the batch, and
        the target hidden states of its positions (``hidden``, the prefill's own, with the
        kept ones of the prefix's slots before each request's, for EAGLE kinds)."""
        prefix_lens = list(batch.prefix_lens)
        rids = [req.rid for req in batch.reqs]
        first = self._catchable(worker, batch.req_pool_indices, prefix_lens, rids)
        if all(start == prefix for start, prefix in zip(first, prefix_lens, strict=True)):
            yield False, hidden
            return
        if not self.hidden_complete(hidden, batch.extend_num_tokens):
            yield False, hidden  # the prefill's own hidden states are not all there
            return
        req_to_token = worker.req_to_token_pool.req_to_token
        tokens, slots, states, added, offset = [], [], [], [], 0
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
            if self.keeps_hidden:
                states += [self._hidden_at(prefix_slots), hidden[offset : offset + length]]
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
            yield True, torch.cat(states) if states else hidden
        finally:
            for name, value in saved.items():
                setattr(batch, name, value)
        self.drafted(torch.cat(slots[0::2]))
        self.tokens_caught_up += sum(added)

    def _hidden_at(self, slots: Tensor) -> Tensor:
        """The kept hidden states of these slots: `_catchable` plans none without one (a
        plain step and a skipped prefill both capture the target's)."""
        assert self.hidden is not None, "an EAGLE catch-up before any hidden state was kept"
        return self.hidden[slots]

    def _catchable(self, worker, pool_rows: Tensor, ends: list[int], rids: list[str]) -> list[int]:
        """Per request, its first position below its ``ends`` entry whose draft KV is not
        valid and can be caught up (the entry if none). An EAGLE draft cannot be caught up
        at a slot without a kept hidden state, nor therefore before it (its KV past that
        position would attend to the stale one): the first is past the last such slot, and
        the positions not valid below it are counted as left stale, once per request."""
        width = max(ends, default=0)
        if width == 0:
            return list(ends)
        req_to_token = worker.req_to_token_pool.req_to_token
        rows = pool_rows.to(torch.int64)
        slots = req_to_token[rows, :width].to(torch.int64)  # no whole rows copied
        limits = torch.tensor(ends, device=rows.device)
        columns = torch.arange(width, device=rows.device)
        stale = ~self.valid[slots] & (columns[None, :] < limits[:, None])
        if self.keeps_hidden:
            lost = stale & ~self.has_hidden[slots]
            if bool(lost.any()):
                # past the last lost position: columns + 1 where lost, its row's maximum
                reachable = torch.where(lost, columns + 1, 0).amax(1)
                counted = torch.tensor([self._stale_counted.get(rid, 0) for rid in rids])
                counted = counted.to(rows.device)
                below = (columns[None, :] < reachable[:, None]) & stale
                newly = below & (columns[None, :] >= counted[:, None])
                self.positions_left_stale += int(newly.sum())
                for rid, mark in zip(rids, reachable.tolist(), strict=True):
                    if mark:
                        self._stale_counted[rid] = max(self._stale_counted.get(rid, 0), mark)
                stale &= columns[None, :] >= reachable[:, None]
        return torch.where(stale.any(1), stale.int().argmax(1), limits).tolist()

    # -- planning ------------------------------------------------------------------------

    def plan(self, worker, batch) -> Plan:
        """Each request's first position whose draft KV is not valid, up to its step's
        token (position ``seq_lens``), at most ``chunk`` of them; past the slots an earlier
        request of the batch plans over (a prefix they share: written once)."""
        ends = batch.seq_lens.tolist()
        rids = [req.rid for req in batch.reqs]
        ahead = [end + 1 for end in ends]
        first = self._catchable(worker, batch.req_pool_indices, ahead, rids)
        req_to_token = worker.req_to_token_pool.req_to_token
        planned: set[int] = set()
        starts, stops = [], []
        rows = batch.req_pool_indices.tolist()
        for row, start, end in zip(rows, first, ends, strict=True):
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
        read every step, without the plan's walk over each row)."""
        ends = batch.seq_lens.tolist()
        rids = [req.rid for req in batch.reqs]
        first = self._catchable(worker, batch.req_pool_indices, ends, rids)
        return sum(max(end - start, 0) for start, end in zip(first, ends, strict=True))

    # -- the extend ----------------------------------------------------------------------

    def run(self, worker, batch, plan: Plan, next_ids: Tensor):
        """One draft extend over each request's planned positions (the draft's prefill
        path); returns its next draft input (meaningful where the plan reached the step's
        token). The draft's KV at every planned position becomes valid."""
        draft = worker.draft_worker
        req_to_token = worker.req_to_token_pool.req_to_token
        device = batch.seq_lens.device
        tokens, slots, lengths, tails = [], [], [], []
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
        written = torch.cat(slots)
        states = self._hidden_at(written) if self.keeps_hidden else None
        saved = {name: getattr(batch, name) for name in _CHANGED}
        try:
            batch.forward_mode = ForwardMode.EXTEND
            batch.input_ids = torch.cat(tokens)
            batch.out_cache_loc = written
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
            states = draft.draft_kind.draft_hidden_for_prefill(states)
            tail = torch.cat(tails)
            draft_input = draft.sglang_prefill_extend(batch, states, tail)
        finally:
            for name, value in saved.items():
                setattr(batch, name, value)
        self.drafted(written)
        self.tokens_caught_up += sum(lengths)
        return draft_input, torch.tensor(lengths, dtype=torch.int64, device=device)
