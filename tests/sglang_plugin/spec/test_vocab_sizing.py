"""The draft worker sizes NanoSpec's state by SGLang's running requests, not its request
pool (thousands of entries on a GPU, each O(V) of window state if it were a slot)."""

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.runtime_context import get_parallel

from nanospec_server.config import NanoSpecConfig
from nanospec_server.sglang_plugin.spec.draft_worker import build_vocab
from nanospec_server.vocab.dynamic_vocab import UNION_WINDOWS

VOCAB, HIDDEN, POOL, RUNNING = 5_000, 8, 200_000, 6


@pytest.fixture(autouse=True)
def one_rank() -> Iterator[None]:
    """build_vocab asks SGLang's parallel context for the TP size, which a scheduler
    publishes at start; here one rank, as an unsharded head is."""
    with get_parallel().override(tp_size=1):
        yield


def worker(max_running: int = RUNNING) -> SimpleNamespace:
    """The attributes of SGLang's EagleDraftWorker that build_vocab reads; the request
    pool is a zero-stride view: its shape is huge, its memory is not."""
    weight = torch.randn(VOCAB, HIDDEN)
    runner = SimpleNamespace(
        max_running_requests=max_running,
        model_config=SimpleNamespace(hf_eos_token_id={2, 7}),
    )
    return SimpleNamespace(
        target_worker=SimpleNamespace(model_runner=runner),
        draft_runner=SimpleNamespace(model=SimpleNamespace(lm_head=SimpleNamespace(weight=weight))),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros(1, 1).expand(POOL, 4096)),
    )


def test_state_and_union_are_sized_by_running_requests_not_the_pool():
    config = NanoSpecConfig(w_max=64, w_cap=128)
    vocab, slot_pool = build_vocab(worker(), config)
    assert vocab.window.num_slots == RUNNING + 1  # padding slot 0 + one per running request
    assert vocab.head.capacity == RUNNING * 128 + 2  # every running window fits: no overflow
    assert slot_pool.table.shape == (POOL,)  # the pool only costs its 8-byte map
    report = vocab.memory_report()
    assert report["total_bytes"] < RUNNING * 6 * VOCAB + 2 * VOCAB * HIDDEN * 4


def test_default_union_capacity_stays_far_below_a_copy_of_the_head():
    config = NanoSpecConfig(w_max=64, w_cap=128)
    vocab, _ = build_vocab(worker(max_running=512), config)
    assert vocab.head.capacity == UNION_WINDOWS * 128 + 2 < VOCAB
    assert vocab.window.num_slots == 513


def test_union_capacity_setting_is_clamped_to_the_head():
    vocab, _ = build_vocab(worker(), NanoSpecConfig(union_capacity=10**9))
    assert vocab.head.capacity == VOCAB
    vocab, _ = build_vocab(worker(), NanoSpecConfig(union_capacity=1))
    assert vocab.head.capacity == 2  # the EOS rows are pinned
