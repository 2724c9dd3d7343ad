"""A depth-0 step is SGLang's plain decode step: bit-identical to plain decoding, in every
draft kind, pinned at depth 0, switched to drafting and back mid-request, and under the policy.

One server per (draft kind, tree shape); scenarios switch by live settings, and a request
that needs the verify path ends them. The random tiny target and its drafts (proposals
depend on context) in fp32, prefilled in chunks, two waves of concurrent requests with
log-probabilities (`test_bitwise_lossless.answers`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
import requests

from nanospec_server.config import NanoSpecConfig
from nanospec_server.launch.server import generate, speculative_flags
from tests.serving.test_adaptive_lossless import adaptive_stats, change_settings
from tests.serving.test_bitwise_lossless import CHUNKED, PROMPTS, answers

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]

ADAPTIVE = ["--nanospec-adaptive", "--nanospec-mode", "nanospec", "--nanospec-w-max", "48"]
CONFIGS = {
    "eagle-chain": speculative_flags("EAGLE", "tiny-eagle", 3, 1, 4),
    "eagle3-tree": speculative_flags("EAGLE3", "tiny-eagle3", 3, 2, 6),
    "standalone-tree": speculative_flags("STANDALONE", "tiny-standalone", 3, 2, 6),
}
FLIP_EVERY_S = 0.05


@pytest.fixture(scope="module")
def plain_answers(serve) -> list:
    with serve("tiny-target", []) as url:
        return answers(url)


def assert_bitwise(expected: list, got: list) -> None:
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert have[0] == want[0], f"request {index}: tokens differ"
        assert have[1] == want[1], f"request {index}: log-probabilities differ"


def pin(url: str, depth: int) -> None:
    response = change_settings(url, {"adaptive_depth": depth})
    assert response.status_code == 200, response.text


def flipping(url: str, deepest: int, stop: threading.Event) -> threading.Thread:
    """Pins depth 0 and the deepest in turn until ``stop``: runs of plain steps between
    drafting steps, wherever the requests are."""

    def run() -> None:
        depth = 0
        while not stop.is_set():
            pin(url, depth)
            depth = deepest if depth == 0 else 0
            stop.wait(FLIP_EVERY_S)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


TOP_K_BODY = {
    "input_ids": PROMPTS[2],
    "sampling_params": {"temperature": 0.0, "max_new_tokens": 12},
    "return_logprob": True,
    "top_logprobs_num": 3,
}


@dataclass
class Runs:
    """One server's scenarios, in order: pinned at depth 0, switched between depth 0 and
    drafting mid-request, chosen by the policy, then a request that needs the verify path
    at depth 0 (top-k log-probabilities), with /stats/vocab's adaptive block around it."""

    kind: str
    pinned: list
    at_zero: dict
    one: dict
    flipped: list
    chosen: list
    stats: dict
    totals: dict
    before_top_k: dict
    top_k: dict
    after_top_k: dict


@pytest.fixture(scope="module", params=list(CONFIGS))
def runs(request, serve) -> Runs:
    with serve("tiny-target", CONFIGS[request.param] + ADAPTIVE + CHUNKED) as url:
        pin(url, 0)
        pinned = answers(url)
        at_zero = adaptive_stats(url)
        one = generate(url, PROMPTS[3], 40)
        stop = threading.Event()
        thread = flipping(url, 3, stop)
        flipped = answers(url)
        stop.set()
        thread.join()
        pin(url, -1)
        chosen = answers(url)
        stats = adaptive_stats(url)
        totals = requests.get(f"{url}/stats/vocab", timeout=60).json()["aggregates"]
        pin(url, 0)
        before_top_k = adaptive_stats(url)
        top_k = requests.post(f"{url}/generate", json=TOP_K_BODY, timeout=600).json()
        after_top_k = adaptive_stats(url)
    return Runs(request.param, pinned, at_zero, one, flipped, chosen, stats, totals, before_top_k, top_k,
                after_top_k)  # fmt: skip


def test_depth_zero_runs_the_plain_decode_path_bit_identically(plain_answers, runs) -> None:
    at_zero, one, stats, totals = runs.at_zero, runs.one, runs.stats, runs.totals
    # Pinned at 0: every decode step took the plain path, none SGLang's verify.
    assert_bitwise(plain_answers, runs.pinned)
    assert set(at_zero["steps_by_depth"]) == {"0"}, at_zero
    assert at_zero["plain_steps"] == at_zero["steps_by_depth"]["0"] > 0, at_zero
    assert at_zero["depth_0_verifies"] == 0, at_zero
    # Greedy, no sampler edits: each plain step read its tokens from its top-k pass.
    assert at_zero["plain_steps_argmax_from_topk"] == at_zero["plain_steps"], at_zero
    assert {step["path"] for step in at_zero["recent_steps"]} == {"plain"}, at_zero
    # Each plain step emitted one token and was counted once, apart from draft steps.
    record = one["meta_info"]["nanospec"][-1]
    assert record["plain_steps"] == one["meta_info"]["completion_tokens"] - 1, record
    assert record["emitted_tokens"] == record["plain_steps"], record
    assert record["draft_steps"] == 0 and record["drafted_tokens"] == 0, record
    assert record["plain_steps"] == one["meta_info"]["spec_verify_ct"], record
    # Its window got the prompt, then each plain step's token and top-K_ver, once: the
    # entries plain steps leave for the next read were all applied by the last snapshot.
    # (EAGLE-3 takes a top-K_pre in the target's prefill, at the positions it computed;
    # the others defer theirs to a first drafting step, which never came.)
    config = NanoSpecConfig()
    prefill = len(PROMPTS[3])
    if runs.kind.startswith("eagle3"):
        prefill += config.k_pre * (len(PROMPTS[3]) - one["meta_info"]["cached_tokens"])
    plain = record["plain_steps"] * (1 + config.k_ver)
    assert record["stream_length"] == prefill + plain, record

    # Switched between plain steps and drafting mid-request, and chosen by the policy.
    assert_bitwise(plain_answers, runs.flipped)
    assert_bitwise(plain_answers, runs.chosen)
    assert {"0", "3"} <= set(stats["steps_by_depth"]), stats
    assert stats["depth_0_verifies"] == 0, stats
    assert totals["plain_steps"] > 0 and totals["draft_steps"] > 0, totals
    drafting_emitted = totals["emitted_tokens"] - totals["plain_steps"]
    assert totals["accept_length_mean"] == pytest.approx(drafting_emitted / totals["draft_steps"])


def test_requests_that_need_the_verify_path_keep_it(plain_answers, runs) -> None:
    """A batch holding a request with top-k log-probabilities runs its depth-0 steps through
    SGLang's verify path (counted, with the reason); its answer is plain decoding's."""
    before, stats = runs.before_top_k, runs.after_top_k
    assert runs.top_k["output_ids"] == plain_answers[2][0][:12]
    kept = stats["depth_0_on_verify_path"]["top-k log-probabilities"]
    assert kept == 11 and not before["depth_0_on_verify_path"], stats
    assert stats["depth_0_verifies"] - before["depth_0_verifies"] == 11, stats
    assert stats["plain_steps"] == before["plain_steps"], stats


def test_verify_depth_0_flag_keeps_sglangs_depth_0_step(serve, plain_answers) -> None:
    """`--nanospec-adaptive-verify-depth-0`: the reference the plain step is measured against."""
    flags = CONFIGS["eagle-chain"] + ADAPTIVE + ["--nanospec-adaptive-verify-depth-0"]
    with serve("tiny-target", flags) as url:
        pin(url, 0)
        before = adaptive_stats(url)
        reply = generate(url, PROMPTS[2], 12)
        stats = adaptive_stats(url)
    assert reply["output_ids"] == plain_answers[2][0][:12]
    assert stats["plain_depth_0"] is False and stats["plain_steps"] == 0, stats
    assert stats["depth_0_verifies"] - before["depth_0_verifies"] == 11, stats
