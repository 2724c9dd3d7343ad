"""Adaptive speculation in SGLang's real workers: lossless while the depth changes mid-run.

Ours (`--nanospec-adaptive`) for every draft kind: EAGLE and STANDALONE chains, an EAGLE
top-k 2 tree; SGLang's own (`--speculative-adaptive`) composed with NanoSpec. Requests
arrive one after another and finish at different lengths, so batch sizes change under the
policy. The agree pair (a context-free target, a draft that predicts it whenever the
successor is in its vocabulary) makes every draft token accepted while NanoSpec's state is
right, so a stale window or packed head after a depth change shows as a rejection.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from nanospec_server.launch.server import generate, speculative_flags
from nanospec_server.models.tiny.tokenizer import BOS_ID, VOCAB_SIZE
from tests.serving.conftest import ADMIN_KEY, make_prompts
from tests.serving.test_nanospec_modes import CHAIN_PROMPTS

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

PROMPTS = make_prompts(count=6, seed=21) + CHAIN_PROMPTS[:4]
MAX_NEW = [6 + 5 * (i % 5) for i in range(len(PROMPTS))]
ARRIVAL_GAP_S = 0.15
CYCLE = VOCAB_SIZE - 3  # the agree target walks this cycle through the vocabulary
CYCLE_PROMPT = [BOS_ID, 5]
CYCLE_NEW = CYCLE + 300
W_MAX = 8192  # the stale-state check needs a whole lap of the vocabulary in the window
STALE_STATE_CHECKED = {"eagle-chain", "standalone-chain"}
KEEP_EXTEND = ["--nanospec-adaptive-keep-extend"]
# A depth-0 step skips the draft extend unless the next step drafts (the default); "-keep"
# runs it on every step.
KINDS = {
    "eagle-chain": speculative_flags("EAGLE", "agree-eagle", 3, 1, 4),
    "standalone-chain": speculative_flags("STANDALONE", "agree-standalone", 3, 1, 4),
    "standalone-chain-keep": speculative_flags("STANDALONE", "agree-standalone", 3, 1, 4)
    + KEEP_EXTEND,
    "eagle-tree": speculative_flags("EAGLE", "agree-eagle", 3, 2, 6),
}


def generate_staggered(url: str) -> list[list[int]]:
    """The prompts in pairs, each pair ARRIVAL_GAP_S after the one before: the batch grows
    as requests arrive and shrinks as the short ones finish. Pairs, because on a fast host
    a lone request may finish before the next arrives, leaving every step at batch 1."""

    def one(i: int) -> list[int]:
        time.sleep(i // 2 * ARRIVAL_GAP_S)
        return generate(url, PROMPTS[i], MAX_NEW[i])["output_ids"]

    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        return list(pool.map(one, range(len(PROMPTS))))


def adaptive_stats(url: str) -> dict:
    return requests.get(f"{url}/stats/vocab", timeout=60).json()["adaptive"]


@pytest.fixture(scope="module")
def plain_server(serve) -> dict:
    """Plain decoding's outputs: the staggered prompts, and the long cycle request."""
    with serve("agree-target", []) as url:
        staggered = generate_staggered(url)
        cycle = generate(url, CYCLE_PROMPT, CYCLE_NEW)["output_ids"]
    return {"staggered": staggered, "cycle": cycle}


@pytest.fixture(scope="module")
def plain_outputs(plain_server) -> list[list[int]]:
    return plain_server["staggered"]


def set_adaptive(url: str, on: bool) -> requests.Response:
    return change_settings(url, {"adaptive": on})


def change_settings(url: str, changes: dict) -> requests.Response:
    return requests.post(
        f"{url}/nanospec/settings", json=changes, headers={"X-Admin-Key": ADMIN_KEY}, timeout=60
    )


# (emitted tokens past which, the depth pinned from then on): runs of depth 0 in both laps,
# each followed by full depth; the second lap's drafts must all be accepted.
PIN_SCHEDULE = [(0, 0), (CYCLE // 2, 3), (CYCLE + 60, 0), (CYCLE + 120, 3), (CYCLE + 180, 0),
                (CYCLE + 230, 3)]  # fmt: skip


@pytest.mark.parametrize("kind", ["eagle-chain", "standalone-chain"])
def test_depth_zero_runs_leave_no_stale_state(serve, plain_server, kind: str) -> None:
    """Runs of depth-0 steps (the draft extend skipped but before the step that drafts
    again), then full depth, both ways and in both laps of the agree target's cycle. The
    output is plain decoding's; on the second lap every drafted token is accepted, which
    fails if a depth-0 step left NanoSpec's window without a verified token or its top-K_ver
    (the successor would be missing from the draft vocabulary), or if drafting resumed from
    a stale draft input (SGLang's zero stub drafts token 0)."""
    flags = KINDS[kind] + ["--nanospec-adaptive", "--nanospec-w-max", str(W_MAX)]
    with serve("agree-target", flags) as url:
        assert change_settings(url, {"adaptive_depth": 0}).status_code == 200
        deferred_before = adaptive_stats(url)["prefills_deferred"]  # the health check's
        pins = list(PIN_SCHEDULE[1:])

        def follow_schedule(snapshot: dict) -> None:
            while pins and snapshot["emitted_tokens"] >= pins[0][0]:
                response = change_settings(url, {"adaptive_depth": pins.pop(0)[1]})
                assert response.status_code == 200, response.text

        snapshots, meta = streamed_snapshots(url, CYCLE_PROMPT, CYCLE_NEW, follow_schedule)
        adaptive = adaptive_stats(url)
        refused = change_settings(url, {"adaptive_depth": 2 if kind.endswith("tree") else 7})
    assert meta["output_ids"] == plain_server["cycle"]
    assert not pins, "the stream ended before the schedule did"
    assert adaptive["skip_extend_at_depth_0"] and adaptive["pinned_depth"] == 3
    assert {"0", "3"} <= set(adaptive["steps_by_depth"]), adaptive
    # every depth-0 step but the last of each run (5 runs) went without the extend
    assert adaptive["extends_skipped"] >= adaptive["steps_by_depth"]["0"] - 5 > 0, adaptive
    # pinned at depth 0 when it arrived, the request's top-K_pre waited for its first
    # drafting step: the second lap's drafts all come from the window all the same
    assert adaptive["prefills_deferred"] - deferred_before == 1
    assert adaptive["prefill_topks_skipped"] == 0
    assert refused.status_code == 400 and "adaptive_depth" in refused.text
    lap = [s for s in snapshots if s["emitted_tokens"] > CYCLE + 3][:-1]
    drafted = lap[-1]["drafted_tokens"] - lap[0]["drafted_tokens"]
    accepted = lap[-1]["accepted_draft_tokens"] - lap[0]["accepted_draft_tokens"]
    assert drafted >= 60 and accepted == drafted, (drafted, accepted, adaptive)


# STANDALONE with the extend kept at depth 0 runs the paths the other two chains cover
# (SGLang's own extend; our controller on a STANDALONE worker): slow, to keep CI short.
KIND_PARAMS = [
    pytest.param(kind, marks=pytest.mark.slow) if kind.endswith("keep") else kind for kind in KINDS
]


@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_our_policy_is_lossless_for_every_draft_kind(serve, plain_outputs, kind: str) -> None:
    flags = KINDS[kind] + ["--nanospec-adaptive", "--nanospec-w-max", str(W_MAX)]
    with serve("agree-target", flags) as url:
        if kind in STALE_STATE_CHECKED:
            check_no_stale_state(url)
            assert set_adaptive(url, True).status_code == 200
        assert generate_staggered(url) == plain_outputs
        stats = adaptive_stats(url)
    assert stats["policy"] == "goodput" and stats["enabled"]
    assert stats["candidate_depths"] == ([0, 3] if kind.endswith("tree") else [0, 1, 2, 3])
    assert stats["skip_extend_at_depth_0"] == (not kind.endswith("keep"))
    ran = {int(depth) for depth in stats["steps_by_depth"]}
    assert 0 in ran and len(ran) >= 2, stats  # the depth did change during the run
    # ... under changing batch sizes (over every step: the recent ones may all be the tail's)
    assert len(stats["steps_by_batch_size"]) >= 2, stats
    assert all(step["step_ms"] > 0 for step in stats["recent_steps"])  # timed on a CPU
    cycles = [step for step in stats["recent_steps"] if "cycle_ms" in step]  # priced whole
    assert cycles and all(step["cycle_ms"] >= step["step_ms"] for step in cycles), stats


def streamed_snapshots(
    url: str, input_ids: list[int], max_new_tokens: int, on_chunk=None
) -> tuple[list[dict], dict]:
    """The request's NanoSpec statistics as each streamed chunk left the server (asked for
    on every chunk: by default a streamed reply carries them on its last), and the last
    meta_info (with the whole ``output_ids``). ``on_chunk`` sees each snapshot as it
    arrives."""
    params = {
        "temperature": 0.0,
        "max_new_tokens": max_new_tokens,
        "custom_params": {"nanospec_stats_every_chunk": True},
    }
    body = {"input_ids": input_ids, "sampling_params": params, "stream": True}
    snapshots, meta = [], {}
    with requests.post(f"{url}/generate", json=body, stream=True, timeout=600) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines():
            if line.startswith(b"data: {"):
                chunk = json.loads(line[len(b"data: ") :])
                meta = chunk["meta_info"] | {"output_ids": chunk.get("output_ids")}
                snapshots.append(meta["nanospec"][-1])
                if on_chunk is not None:
                    on_chunk(snapshots[-1])
    return snapshots, meta


def check_no_stale_state(url: str) -> None:
    """The target walks one cycle through the vocabulary; the prompt holds its first token
    only, so on the second lap every token must come from the candidate stream, including
    those of the first steps, which explore every depth (0 too). A window, packed head or
    per-request state left stale by a switch rejects a draft token there: on the second lap
    every drafted token must be accepted, and `drafted_tokens` counts the depths as run.
    With the draft extend skipped at depth 0, our hook must still feed the window."""
    cycle = VOCAB_SIZE - 3
    switched = threading.Event()

    def fix_depth_once_depth_zero_ran() -> None:
        # Off, the policy drafts at the launch depth: the second lap runs deep.
        while not switched.is_set():
            if "0" in adaptive_stats(url)["steps_by_depth"]:
                response = set_adaptive(url, False)
                assert response.status_code == 200, response.text
                switched.set()
            time.sleep(0.05)

    watcher = threading.Thread(target=fix_depth_once_depth_zero_ran, daemon=True)
    watcher.start()
    # A second lap of 400 tokens: ~100 steps, so that its chunks reach the client apart
    # even where a loaded host merges a stream's chunks.
    snapshots, meta = streamed_snapshots(url, [BOS_ID, 5], cycle + 400)
    switched.set()
    watcher.join()
    adaptive = adaptive_stats(url)
    assert adaptive["enabled"] is False
    assert {"0", "3"} <= set(adaptive["steps_by_depth"]), adaptive
    assert [s["draft_steps"] for s in snapshots] == sorted(s["draft_steps"] for s in snapshots)
    last = snapshots[-1]
    assert last["plain_steps"] > 0  # some steps ran at depth 0, on the plain decode path
    # Every step counted once, depth-0 ones apart (through our hooks): SGLang counts them
    # all as verify passes, and every token sent was emitted by one.
    steps = last["draft_steps"] + last["plain_steps"]
    assert steps == meta["spec_verify_ct"], (last, meta["spec_verify_ct"])
    assert last["emitted_tokens"] >= meta["completion_tokens"], last
    # The second lap: from the first snapshot past one cycle to the one before the last
    # (the last step may draft past max_new_tokens and have its tail cut).
    lap = [s for s in snapshots if s["emitted_tokens"] > cycle + 3][:-1]
    assert len(lap) >= 2, [s["emitted_tokens"] for s in snapshots]
    drafted = lap[-1]["drafted_tokens"] - lap[0]["drafted_tokens"]
    accepted = lap[-1]["accepted_draft_tokens"] - lap[0]["accepted_draft_tokens"]
    assert drafted >= 60 and accepted == drafted, (drafted, accepted, adaptive)


def test_sglang_policy_composes_with_nanospec(serve, plain_outputs, tmp_path) -> None:
    """SGLang's own --speculative-adaptive, tuned to switch at once: up to 5 steps (past
    the launch's 3; SGLang sizes its buffers for the largest) alone, 0 or 2 in a batch.
    Our live switch needs our policy: refused here, with the flag named."""
    fast = {"warmup_batches": 0, "update_interval": 1, "down_hysteresis": 0.0}
    config = {"1": {"candidate_steps": [1, 3, 5], **fast}, "2": {"candidate_steps": [0, 2], **fast}}
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps(config))
    flags = KINDS["eagle-chain"] + ["--speculative-adaptive"]
    flags += ["--speculative-adaptive-config", str(path)]
    with serve("agree-target", flags) as url:
        assert generate_staggered(url) == plain_outputs
        stats = adaptive_stats(url)
        refused = set_adaptive(url, True)
    assert stats["policy"] == "sglang"
    assert len(stats["steps_by_depth"]) >= 2, stats
    assert refused.status_code == 400 and "--nanospec-adaptive" in refused.text


def test_fixed_policy_drafts_the_launch_depth_and_is_lossless(serve, plain_outputs) -> None:
    """`--nanospec-adaptive-policy fixed` behind the same extension point as goodput: every
    step at the launch's depth, greedy output plain decoding's, and the live pin still
    moves it."""
    flags = KINDS["eagle-chain"] + ["--nanospec-adaptive", "--nanospec-adaptive-policy", "fixed"]
    with serve("agree-target", flags) as url:
        assert generate_staggered(url) == plain_outputs
        fixed = adaptive_stats(url)
        assert change_settings(url, {"adaptive_depth": 1}).status_code == 200
        assert generate(url, PROMPTS[0], MAX_NEW[0])["output_ids"] == plain_outputs[0]
        pinned = adaptive_stats(url)
    assert fixed["policy"] == "fixed" and fixed["enabled"] and fixed["fixed_depth"] == 3
    assert fixed["candidate_depths"] == [0, 1, 2, 3]
    assert set(fixed["steps_by_depth"]) == {"3"}, fixed
    assert {step["reason"] for step in fixed["recent_steps"]} == {"fixed"}, fixed
    assert fixed["extends_skipped"] == 0 and fixed["prefill_topks_skipped"] == 0
    assert fixed["prefills_deferred"] == 0  # every step drafts: nothing to wait for
    assert pinned["pinned_depth"] == 1 and "1" in pinned["steps_by_depth"], pinned


def test_a_server_started_from_a_calibration_prices_steps_at_once(
    serve, plain_outputs, tmp_path
) -> None:
    """The calibration one server publishes, written to a file, starts the next one's cost
    model: ready before its first request, it decides on goodput from its first steps
    (no exploring) and stays lossless."""
    flags = KINDS["eagle-chain"] + ["--nanospec-adaptive"]
    with serve("agree-target", flags) as url:
        assert adaptive_stats(url)["calibration"] is None  # nothing timed yet
        for prompt, max_new in itertools.islice(
            itertools.cycle(zip(PROMPTS, MAX_NEW, strict=True)), 30
        ):
            generate(url, prompt, max_new)  # one at a time: batches of 1
            if adaptive_stats(url)["cost_model_ready"]:
                break
        measured = adaptive_stats(url)
    assert measured["cost_model_ready"], measured
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(measured["calibration"]))
    with serve("agree-target", flags + ["--nanospec-adaptive-calibration", str(path)]) as url:
        fresh = adaptive_stats(url)
        assert generate_staggered(url) == plain_outputs
        after = adaptive_stats(url)
    assert fresh["cost_model_ready"] and fresh["calibrated_from"] == str(path.resolve()), fresh
    assert fresh["calibration"]["server"] == measured["calibration"]["server"]
    # every cell the file priced (SGLang's warm-up request may have added timings since)
    assert cells(fresh["calibration"]) >= cells(measured["calibration"]) != set()
    reasons = {step["reason"] for step in after["recent_steps"]}
    assert not reasons & {"explore", "explore-later"}, after["recent_steps"]


def cells(calibration: dict) -> set[tuple[int, int, str]]:
    return {(c["batch_size"], c["depth"], c["path"]) for c in calibration["timings"]["cells"]}
