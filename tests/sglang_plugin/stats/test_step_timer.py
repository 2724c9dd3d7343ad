"""The step timer charges a draft phase to its batch's requests, and LM-head calls only
inside a phase."""

from __future__ import annotations

import time

import torch

from nanospec_server.sglang_plugin.stats.step_timer import StepTimer


def test_phases_charge_their_requests_and_heads_count_only_inside_a_phase() -> None:
    timer = StepTimer(num_slots=4, enabled=True)
    with timer.lm_head():  # a prefill's head call: no phase is open
        time.sleep(0.01)
    assert timer.read([0, 1, 2, 3]) == [(0.0, 0.0)] * 4
    with timer.draft_phase(torch.tensor([1, 3])):
        time.sleep(0.01)
        with timer.lm_head():
            time.sleep(0.02)
        with timer.draft_phase(torch.tensor([1, 3])):  # nested: timed once, by the outer
            pass
    (d0, h0), (d1, h1), (d2, _), (d3, h3) = timer.read([0, 1, 2, 3])
    assert d0 == h0 == d2 == 0.0
    assert d1 == d3 >= 0.03 and h1 == h3 >= 0.02 and h1 < d1
    timer.reset(torch.tensor([1]))
    assert timer.read([1, 3]) == [(0.0, 0.0), (d3, h3)]


def test_a_disabled_timer_reads_nothing() -> None:
    timer = StepTimer(num_slots=2, enabled=False)
    with timer.draft_phase(torch.tensor([0])), timer.lm_head():
        pass
    assert timer.read([0, 1]) == [None, None]
    assert timer.seconds.sum() == 0
