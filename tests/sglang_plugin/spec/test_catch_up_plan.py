"""The catch-up plan against a plain reading of the validity bits (no server).

The plan of each request starts at its first position whose draft KV is not valid, ends at
its step's token, takes at most a chunk, and for an EAGLE draft starts past every position
whose slot holds no kept hidden state; positions it must leave stale are counted once,
however many steps plan over them; the positions owed (what the policy prices) are the plan's. Requests
that share slots (a radix prefix) plan them once; each slot the target wrote alone keeps
the token the draft is fed there."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanospec_server.sglang_plugin.spec.catch_up import DraftCatchUp

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
            st.lists(st.booleans(), min_size=WIDTH, max_size=WIDTH),  # hidden state kept
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
    # the step's own slot was just written by the target, with its hidden state
    kept = [[*bits[:end], True, *bits[end + 1 :]] for end, _, bits in requests]
    catch_up.has_hidden = torch.tensor([bit for bits in kept for bit in bits])
    owed = catch_up.owed(worker, batch)
    plan = catch_up.plan(worker, batch)
    plan_again = catch_up.plan(worker, batch)

    left_stale = 0
    for i, (end, bits, _) in enumerate(requests):
        stale = [p for p in range(end + 1) if not bits[p]]
        lost = [p for p in stale if not kept[i][p]] if keeps_hidden else []
        reachable = lost[-1] + 1 if lost else 0
        left_stale += sum(1 for p in stale if p < reachable)
        start = min(next((p for p in stale if p >= reachable), end + 1), end)
        assert plan.start[i] == start and plan.end[i] == end
        assert plan.stop[i] == min(end, start + chunk - 1)
    assert plan_again == plan
    # what the policy prices: every planned position but the step's own token, all chunks
    assert owed == sum(end - start for start, end in zip(plan.start, plan.end, strict=True))
    assert catch_up.positions_left_stale == left_stale  # counted once over three readings


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


@pytest.mark.parametrize("keeps_hidden", [False, True])
def test_a_skipped_prefill_keeps_each_slots_next_token(keeps_hidden: bool) -> None:
    """The draft's input at a slot is the token after it in its writer's sequence (SGLang
    rotates a prefill's input left by one); the last slot's, the request's tail. An EAGLE
    draft's other input, the target's hidden state there, is kept at the slot too."""
    catch_up = DraftCatchUp(16, "cpu", keeps_hidden=keeps_hidden)
    batch = SimpleNamespace(
        input_ids=torch.tensor([10, 11, 12, 20, 21]),
        out_cache_loc=torch.tensor([3, 4, 5, 8, 9]),
        extend_lens=[3, 2],
    )
    hidden = torch.arange(10, dtype=torch.bfloat16).view(5, 2)
    catch_up.valid[:] = True
    catch_up.missed_prefill(batch, torch.tensor([13, 22]), hidden)
    assert catch_up.rotated[[3, 4, 5, 8, 9]].tolist() == [11, 12, 13, 21, 22]
    assert catch_up.valid.logical_not().nonzero().flatten().tolist() == [3, 4, 5, 8, 9]
    # fed at a slot: where valid, the request's own next token; where not, its writer's
    slots = torch.tensor([2, 5])
    assert catch_up._draft_inputs(slots, [7, 99]).tolist() == [7, 13]
    if keeps_hidden:
        assert torch.equal(catch_up._hidden_at(torch.tensor([8, 3])), hidden[[3, 0]])
        assert catch_up.has_hidden.nonzero().flatten().tolist() == [3, 4, 5, 8, 9]
        catch_up.missed(None, torch.tensor([4]), torch.tensor([5]), None)  # none captured
        assert catch_up.has_hidden.nonzero().flatten().tolist() == [3, 5, 8, 9]
    else:
        assert catch_up.hidden is None and not catch_up.has_hidden.any()
