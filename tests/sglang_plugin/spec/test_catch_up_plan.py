"""The catch-up plan against a plain reading of the validity bits (no server).

The plan of each request starts at its first position whose draft KV is not valid, ends at
its step's token, takes at most a chunk, and for an EAGLE draft starts no earlier than the
first kept hidden state; positions it must leave stale are counted once, however many
steps plan over them; the positions owed (what the policy prices) are the plan's."""

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
