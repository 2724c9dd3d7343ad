"""A prefill's top-K_pre deferred to the request's first drafting step (no server): once
appended, the request's active vocabulary is what a top-K_pre taken at prefill leaves
after the same steps, however many of its entries those steps pushed out of the window,
and a request that ends first leaves nothing behind."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanospec_server.config import NanoSpecConfig
from nanospec_server.sglang_plugin.spec.runtime import NanoSpecRuntime
from nanospec_server.sglang_plugin.stats.request_stats import RequestStats
from nanospec_server.vocab import DynamicVocab
from nanospec_server.vocab.slot_pool import SlotPool

VOCAB, HIDDEN, SLOTS = 97, 8, 6


def runtime(k_pre: int, w_max: int = 512) -> NanoSpecRuntime:
    head = torch.randn(VOCAB, HIDDEN, generator=torch.Generator().manual_seed(0))
    config = NanoSpecConfig(k_pre=k_pre, w_max=w_max, w_cap=512)
    return NanoSpecRuntime(
        config=config,
        vocab_size=VOCAB,
        target_head=head,
        stats=RequestStats(SLOTS, VOCAB, torch.device("cpu")),
        vocab=DynamicVocab(head, SLOTS, w_cap=512, w_max=w_max, device="cpu"),
        slot_pool=SlotPool(2 * SLOTS, SLOTS, "cpu"),  # pool entries map to window slots
        recorder=None,
    )


def prefill_batch(prompts: list[list[int]]) -> SimpleNamespace:
    reqs = [
        SimpleNamespace(
            rid=f"r{i}",
            kv=SimpleNamespace(req_pool_idx=i + 1),
            origin_input_ids=prompt,
            output_ids=[],
            sampling_params=SimpleNamespace(custom_params=None),
            finished=lambda: False,
        )
        for i, prompt in enumerate(prompts)
    ]
    return SimpleNamespace(
        reqs=reqs,
        req_pool_indices=torch.arange(1, len(prompts) + 1),
        prefix_lens=[0] * len(prompts),
        extend_lens=[len(p) for p in prompts],
    )


def active_sets(rt: NanoSpecRuntime, batch) -> torch.Tensor:
    slots = rt.vocab_slots(batch.req_pool_indices)
    every = torch.arange(VOCAB).expand(len(batch.reqs), -1)
    return rt.vocab.contains(slots, every)


prompts = st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40), min_size=1,
                   max_size=SLOTS - 1)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(prompts, st.integers(1, 4), st.integers(8, 200), st.integers(0, 12), st.integers(0, 99))
def test_deferred_topk_gives_the_active_set_of_the_prefill(
    prompt_ids, k_pre, w_max, steps, seed
) -> None:
    hidden = torch.randn(sum(map(len, prompt_ids)), HIDDEN)
    eager, lazy = runtime(k_pre, w_max), runtime(k_pre, w_max)
    batch = prefill_batch(prompt_ids)
    eager.on_prefill(batch, hidden)
    lazy.on_prefill(batch, hidden, defer_topk=True)
    prompt_only = active_sets(lazy, batch)
    slots = lazy.vocab_slots(batch.req_pool_indices)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):  # depth-0 steps: each a token and its top-K_ver, 4 entries
        entries = torch.randint(0, VOCAB, (len(prompt_ids), 4), generator=generator)
        for rt in (eager, lazy):
            rt.vocab.append(slots, entries)
            rt.vocab.refresh(slots)
        lazy._count_after_prompt(batch.reqs, torch.full((len(prompt_ids),), 4))
    lazy.append_deferred_topk(batch)
    assert torch.equal(active_sets(lazy, batch), active_sets(eager, batch))
    assert not lazy.deferring
    lazy.append_deferred_topk(batch)  # once only: nothing left to append
    assert torch.equal(active_sets(lazy, batch), active_sets(eager, batch))
    if steps == 0 and w_max >= (1 + k_pre) * max(map(len, prompt_ids)):  # nothing evicted
        assert (active_sets(eager, batch) >= prompt_only).all()


def test_a_request_that_ends_before_drafting_leaves_no_deferred_rows() -> None:
    rt = runtime(3)
    batch = prefill_batch([[1, 2, 3], [4, 5]])
    rt.on_prefill(batch, torch.randn(5, HIDDEN), defer_topk=True)
    assert rt.deferring == {1, 2}
    batch.reqs[0].finished = lambda: True
    rt.release_ended()
    assert rt.deferring == {2} and not rt.owners[1].deferred_hidden
