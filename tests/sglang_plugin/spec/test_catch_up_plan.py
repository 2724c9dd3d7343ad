"""The catch-up plan against a plain reading of the validity bits (no server).

The plan of each request starts at its first position whose draft KV is not valid, ends at
its step's token, takes at most a chunk, and for an EAGLE draft starts no earlier than the
first kept hidden state; positions it must leave stale are counted once, however many
steps plan over them; the positions owed (what the policy prices) are the plan's. Requests
that share slots (a radix prefix) plan them once; each slot the target wrote alone keeps
the token the draft is fed there."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanospec_server.sglang_plugin.spec.catch_up import DraftCatchUp, KeptHidden

WIDTH = 64  # positions per request-pool row


def fake(seq_lens: list[int]) -> tuple[SimpleNamespace, SimpleNamespace]:
    """A worker whose request ``i`` holds KV slots ``i * WIDTH`` .. and a decode batch."""
    rows = len(seq_lens)
    req_to_token = torch.arange(rows * WIDTH, dtype=torch.int32).view(rows, WIDTH)
    worker = SimpleNamespace(req_to_token_pool=SimpleNamespace(req_to_token=req_to_token))
    batch = SimpleNamespace(
        reqs=[SimpleNamespace(rid=f"r{i}") for i in range(rows)],
        req_pool_indices=torch.arange(rows),
        seq_lens=torch.tensor(seq_lens),
    )
    return worker, batch


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, WIDTH - 2),  # the step token's position
            st.lists(st.booleans(), min_size=WIDTH, max_size=WIDTH),  # valid bits
            st.integers(0, WIDTH),  # the first kept hidden state's position (none past it)
        ),
        min_size=1,
        max_size=4,
    ),
    st.integers(1, 16),
    st.booleans(),
)
def test_plan_matches_a_plain_reading(requests, chunk, keeps_hidden):
    worker, batch = fake([end for end, _, _ in requests])
    catch_up = DraftCatchUp(len(requests) * WIDTH, "cpu", keeps_hidden, chunk=chunk)
    catch_up.valid = torch.tensor([bit for _, bits, _ in requests for bit in bits])
    for req, (end, _, first) in zip(batch.reqs, requests, strict=True):
        if first <= end:  # none kept: only the step's own token can be caught up
            catch_up.kept[req.rid] = KeptHidden(first)
    owed = catch_up.owed(worker, batch)
    plan = catch_up.plan(worker, batch)
    plan_again = catch_up.plan(worker, batch)

    left_stale = 0
    for i, (end, bits, first) in enumerate(requests):
        start = next((p for p in range(end + 1) if not bits[p]), end + 1)
        reachable = first if first <= end else end
        if keeps_hidden and start < reachable:
            left_stale += reachable - start
            start = reachable
        start = min(start, end)
        assert plan.start[i] == start and plan.end[i] == end
        assert plan.stop[i] == min(end, start + chunk - 1)
    assert plan_again == plan
    # what the policy prices: every planned position but the step's own token, all chunks
    assert owed == sum(end - start for start, end in zip(plan.start, plan.end, strict=True))
    assert catch_up.positions_left_stale == left_stale  # counted once over two plans


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 40),  # positions the two requests share
    st.integers(0, 20),  # the first request's positions past them
    st.integers(0, 20),  # the second's
    st.integers(1, 64),
    st.booleans(),  # which request the batch holds first
)
def test_a_shared_prefix_is_planned_once(shared, own_a, own_b, chunk, sharer_first):
    """Two requests whose rows start with the same slots, none valid: the first of the
    batch plans over them, the second starts past what the first's chunk covers."""
    worker, batch = fake([shared + own_a, shared + own_b])
    req_to_token = worker.req_to_token_pool.req_to_token
    req_to_token[1, :shared] = req_to_token[0, :shared]
    if sharer_first:
        batch.req_pool_indices = torch.tensor([1, 0])
    catch_up = DraftCatchUp(2 * WIDTH, "cpu", keeps_hidden=False, chunk=chunk)
    plan = catch_up.plan(worker, batch)

    first_stop = min(plan.end[0], chunk - 1)
    assert plan.start[0] == 0 and plan.stop[0] == first_stop
    assert plan.start[1] == min(first_stop + 1, shared)  # past the shared slots planned
    assert plan.stop[1] == min(plan.end[1], plan.start[1] + chunk - 1)
    rows = batch.req_pool_indices.tolist()
    spans = [
        req_to_token[row, start : stop + 1].tolist()
        for row, start, stop in zip(rows, plan.start, plan.stop, strict=True)
    ]
    assert not set(spans[0]) & set(spans[1])  # no slot written twice in one extend


def test_a_skipped_prefill_keeps_each_slots_next_token() -> None:
    """The draft's input at a slot is the token after it in its writer's sequence (SGLang
    rotates a prefill's input left by one); the last slot's, the request's tail."""
    catch_up = DraftCatchUp(16, "cpu", keeps_hidden=False)
    batch = SimpleNamespace(
        input_ids=torch.tensor([10, 11, 12, 20, 21]),
        out_cache_loc=torch.tensor([3, 4, 5, 8, 9]),
        extend_lens=[3, 2],
    )
    catch_up.valid[:] = True
    catch_up.missed_prefill(batch, torch.tensor([13, 22]))
    assert catch_up.rotated[[3, 4, 5, 8, 9]].tolist() == [11, 12, 13, 21, 22]
    assert catch_up.valid.logical_not().nonzero().flatten().tolist() == [3, 4, 5, 8, 9]
    # fed at a slot: where valid, the request's own next token; where not, its writer's
    slots = torch.tensor([2, 5])
    assert catch_up._draft_inputs(slots, [7, 99]).tolist() == [7, 13]
