"""packed_rows + mask_logits_ (the path SGLang's logits processor takes) agree with topk."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanospec_server.vocab import DynamicVocab

VOCAB, HIDDEN = 301, 16


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    stream_len=st.integers(0, 40),
    k=st.integers(1, 6),
    w_max=st.integers(1, 32),
)
def test_external_matmul_matches_topk(seed: int, stream_len: int, k: int, w_max: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(VOCAB, HIDDEN, generator=gen)
    vocab = DynamicVocab(weight, num_slots=4, w_cap=32, w_max=w_max, always_active=[1])
    slots = torch.tensor([1, 2])
    tokens = torch.randint(0, VOCAB, (2, stream_len), generator=gen)
    vocab.append(slots, tokens)
    vocab.refresh(slots)
    hidden = torch.randn(6, HIDDEN, generator=gen)
    row_slots = slots.repeat_interleave(3)

    rows, _ = vocab.packed_rows(min_rows=k)
    assert rows.shape[0] >= k  # a top-k over the columns never runs short
    logits = vocab.mask_logits_(hidden @ rows.T, row_slots)
    probs = torch.softmax(logits, -1)
    top_probs, top_rows = probs.topk(k, dim=-1)
    ids = vocab.row_token_ids[top_rows]

    want_probs, want_ids = vocab.topk(hidden, row_slots, k)
    torch.testing.assert_close(top_probs, want_probs)
    live = want_probs > 0
    assert torch.equal(ids[live], want_ids[live])
    assert bool((ids >= 0).all() and (ids < VOCAB).all())
