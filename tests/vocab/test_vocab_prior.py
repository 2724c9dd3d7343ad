"""The hybrid vocabulary I ∪ P in the vocabulary library: the oracle with the prior added.

P (vocab_tools/prior.py) reaches DynamicVocab as pinned rows next to EOS, so the same
property scenarios must hold with a large pinned set: up to the whole vocabulary, which
also makes the union capacity (max_batch * W_cap + |pinned|) clamp to V.
"""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_dynamic_vocab_properties import SLOTS, operation, run_scenario
from vocab_checks import ops_backend
from vocab_oracle import NaiveVocab

from nanospec_server.vocab import DynamicVocab


@st.composite
def hybrid_scenarios(draw):
    vocab_size = draw(st.sampled_from((37, 101)))
    distinct = draw(st.sampled_from([3, vocab_size]))
    w_cap = draw(st.integers(1, 12))
    w_max = draw(st.integers(1, w_cap))
    ranking = draw(st.permutations(range(vocab_size)))  # the prior's frequency order
    prior_k = draw(st.integers(0, vocab_size))
    eos = draw(st.lists(st.integers(0, vocab_size - 1), max_size=2, unique=True))
    pinned = sorted(set(eos) | set(ranking[:prior_k]))
    ops = draw(st.lists(operation(w_cap), min_size=1, max_size=25))
    # None: the default buffer; else often too small for the windows next to a large P.
    most = min(vocab_size, len(pinned) + 2 * w_cap)
    capacity = draw(st.one_of(st.none(), st.integers(len(pinned), most)))
    return vocab_size, distinct, w_cap, w_max, pinned, capacity, ops


@settings(max_examples=100, deadline=None)
@given(scenario=hybrid_scenarios(), seed=st.integers(0, 2**16), backend=st.sampled_from(["reference", "cpu"]))  # fmt: skip
def test_hybrid_vocabulary_matches_the_definition(scenario, seed, backend):
    with ops_backend(backend):
        run_scenario(scenario, seed)


@settings(max_examples=30, deadline=None)
@given(scenario=hybrid_scenarios(), seed=st.integers(0, 2**16))
def test_hybrid_vocabulary_with_the_static_shapes_of_cuda(scenario, seed):
    with ops_backend("reference"):
        run_scenario(scenario, seed, static_shapes=True)


def test_prior_tokens_are_drafted_before_the_window_holds_them():
    """A fresh request (empty window) can already draft every prior token, and topk ranks
    them by the head's logits like any window token."""
    vocab_size, prior = 50, [3, 7, 11, 40]
    weight = torch.randn(vocab_size, 8, generator=torch.Generator().manual_seed(0))
    vocab = DynamicVocab(weight, SLOTS, w_cap=4, w_max=4, always_active=prior)
    naive = NaiveVocab(4, prior)
    slot = torch.tensor([1])
    vocab.reset(slot), naive.reset(1)
    vocab.refresh(slot), naive.refresh(1)
    assert vocab.contains(slot, torch.tensor([prior])).all()
    assert int(vocab.active_size(slot)) == len(prior)
    hidden = torch.randn(1, 8)
    probs, ids = vocab.topk(hidden, slot, k=4)
    expected = sorted(prior, key=lambda t: -float(weight[t] @ hidden[0]))
    assert ids[0].tolist() == expected
    assert torch.allclose(probs.sum(), torch.tensor(1.0))
