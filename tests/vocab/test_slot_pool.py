import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanospec_server.vocab.slot_pool import SlotPool


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 63)), max_size=60))
def test_claims_and_releases_keep_a_one_to_one_map(ops):
    pool, held = SlotPool(pool_size=64, num_slots=5, device="cpu"), {}
    for claim, index in ops:
        if claim and index not in held:
            slot = pool.claim(index)
            assert slot == 0 if len(held) == 4 else slot not in held.values() and slot > 0
            if slot:
                held[index] = slot
        elif not claim:
            assert pool.release(index) == held.pop(index, 0)
        expected = torch.zeros(64, dtype=torch.int64)
        for i, s in held.items():
            expected[i] = s
        assert torch.equal(pool.lookup(torch.arange(64)), expected)
        assert pool.free_slots == 4 - len(held)
