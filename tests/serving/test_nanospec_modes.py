"""Every comparison mode inside SGLang's real EAGLE worker: lossless, with statistics.

Each (mode, tree) pair gets its own server. The agree pair (a context-free target and a
draft that predicts it exactly) makes acceptance depend only on the draft vocabulary, so
the tests can tell what each mode's vocabulary holds.
"""

from __future__ import annotations

import random

import pytest
import requests

from nanospec_server.launch.server import generate, speculative_flags
from nanospec_server.models.tiny import tiny_model_path
from nanospec_server.models.tiny.tokenizer import BOS_ID, CORPUS_PATH, VOCAB_SIZE
from nanospec_server.models.tiny.weights import SEEDS, agree_successor
from nanospec_server.vocab_tools.token_map import build_token_map
from tests.serving import conftest
from tests.serving.conftest import ADMIN_KEY, generate_all, make_prompts

ADMIN_HEADERS = {"X-Admin-Key": ADMIN_KEY}

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

W_MAX, W_CAP, STATIC_K = 64, 8192, 256
NUM_STEPS = 3
TREES = {"topk1": (1, NUM_STEPS + 1), "topk2": (2, 6)}
MODES = ["full", "static", "nanospec", "ctx-only", "ext-only", "sync"]
DYNAMIC = {"nanospec", "ctx-only", "ext-only", "sync"}
SUCCESSOR = agree_successor(VOCAB_SIZE, SEEDS["agree-target"])[0].tolist()


def chain(start: int, length: int) -> list[int]:
    tokens = [start]
    while len(tokens) < length:
        tokens.append(SUCCESSOR[tokens[-1]])
    return tokens


def chain_prompt(start: int, length: int = 40) -> list[int]:
    """A chain of the target's greedy successors, then its first token again: the
    continuation is already in the prompt."""
    return [BOS_ID, *chain(start, length), start]


RNG = random.Random(11)
CHAIN_PROMPTS = [chain_prompt(RNG.randrange(3, VOCAB_SIZE)) for _ in range(8)]
# 16 prompts: random ones (several longer than W_max) and chain ones.
PROMPTS = make_prompts(count=8, seed=3) + CHAIN_PROMPTS
# Different lengths, so requests finish while others continue; a second wave reuses slots.
MAX_NEW = [8 + 4 * (i % 8) for i in range(len(PROMPTS))]


def generate_waves(url: str) -> list[dict]:
    return conftest.generate_waves(url, PROMPTS, MAX_NEW)


@pytest.fixture(scope="module")
def plain_outputs(serve) -> list[list[int]]:
    with serve("agree-target", []) as url:
        return [r["output_ids"] for r in generate_waves(url)]


@pytest.fixture(scope="module")
def token_map(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("static") / "token_map.pt"
    build_token_map(tiny_model_path("agree-target"), [CORPUS_PATH], STATIC_K, path)
    return str(path)


def mode_flags(mode: str, tree: str, token_map: str) -> list[str]:
    topk, tokens = TREES[tree]
    flags = speculative_flags("EAGLE", "agree-eagle", NUM_STEPS, topk, tokens)
    flags += ["--nanospec-mode", mode, "--nanospec-w-max", str(W_MAX)]
    flags += ["--nanospec-w-cap", str(W_CAP)]
    return flags + (["--speculative-token-map", token_map] if mode == "static" else [])


def last_stats(result: dict) -> dict:
    return result["meta_info"]["nanospec"][-1]


def set_settings(url: str, **settings: int) -> dict:
    response = requests.post(
        f"{url}/nanospec/settings", json=settings, headers=ADMIN_HEADERS, timeout=60
    )
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("tree", TREES)
@pytest.mark.parametrize("mode", MODES)
def test_mode_is_lossless_with_consistent_stats(
    serve, plain_outputs, token_map, mode: str, tree: str
) -> None:
    with serve("agree-target", mode_flags(mode, tree, token_map)) as url:
        results = generate_waves(url)
        for expected, result in zip(plain_outputs, results, strict=True):
            assert result["output_ids"] == expected
        for result in results:
            check_stats(last_stats(result), mode)
        if mode in DYNAMIC:
            check_live_w_max(url, mode)
        else:  # no window: a request's own W_max is refused, and the server carries on
            body = {"input_ids": PROMPTS[0], "sampling_params": {"custom_params": {"w_max": 8}}}
            refused = requests.post(f"{url}/generate", json=body, timeout=60)
            assert refused.status_code == 400 and f"nanospec-mode {mode}" in refused.text
            assert generate(url, PROMPTS[0], MAX_NEW[0])["output_ids"] == plain_outputs[0]


def test_standalone_static_drafts_from_the_token_map(serve, plain_outputs, token_map) -> None:
    # SGLang's STANDALONE worker keeps the draft's full head but maps its top-k through the
    # token map; without the pruned head an index past the map's length fails the server.
    flags = speculative_flags("STANDALONE", "agree-standalone", NUM_STEPS, 1, NUM_STEPS + 1)
    flags += ["--nanospec-mode", "static", "--speculative-token-map", token_map]
    with serve("agree-target", flags) as url:
        results = generate_waves(url)
        for expected, result in zip(plain_outputs, results, strict=True):
            assert result["output_ids"] == expected
        assert last_stats(results[0])["lm_head_rows_mean"] == STATIC_K


def check_stats(stats: dict, mode: str) -> None:
    assert stats["mode"] == mode
    assert stats["draft_steps"] > 0
    assert stats["coverage"] is None or 0.0 <= stats["coverage"] <= 1.0
    assert 1.0 <= stats["accept_length_mean"] <= NUM_STEPS + 1
    # timed on a CPU server: the draft takes time each step, its head a part of it
    assert stats["draft_ms_per_step"] > 0 and 0 < stats["lm_head_share"] < 1
    if mode in DYNAMIC:
        eos_pinned = 1
        assert stats["active_vocab_size"] <= W_MAX + eos_pinned
        assert stats["active_vocab_max"] <= W_MAX + eos_pinned
        assert stats["lm_head_rows_mean"] < VOCAB_SIZE
    elif mode == "static":
        assert stats["lm_head_rows_mean"] == STATIC_K
    else:
        assert stats["lm_head_rows_mean"] == VOCAB_SIZE
        assert stats["coverage"] in (None, 1.0)


def check_live_w_max(url: str, mode: str) -> None:
    """A live W_max change shows in the next response; a window that holds the
    continuation lets the agreeing draft keep its full acceptance length."""
    assert set_settings(url, w_max=8)["w_max"] == 8
    small = last_stats(generate(url, CHAIN_PROMPTS[0], 16))
    assert small["active_vocab_size"] <= 8 + 1
    set_settings(url, w_max=W_CAP)
    wide = [last_stats(r) for r in generate_all(url, CHAIN_PROMPTS, [24] * len(CHAIN_PROMPTS))]
    set_settings(url, w_max=W_MAX)
    if mode != "ext-only":  # ext-only never sees the prompt, so it has nothing to keep
        assert min(s["accept_length_mean"] for s in wide) >= NUM_STEPS + 0.5, wide
        assert min(s["coverage"] for s in wide) >= 0.9


@pytest.mark.parametrize("mode", ["nanospec", "ctx-only"])
def test_ctx_only_loses_what_the_stream_keeps(serve, token_map, mode: str) -> None:
    """The target walks one cycle through the whole vocabulary. A generation longer than
    the cycle repeats tokens that the prompt never held: the candidate stream has them
    from the first lap, ctx-only's frozen prompt window does not."""
    cycle = VOCAB_SIZE - 3
    with serve("agree-target", mode_flags(mode, "topk1", token_map)) as url:
        set_settings(url, w_max=W_CAP)
        stats = last_stats(generate(url, [BOS_ID, 5], cycle + 120))
    second_lap = 120
    if mode == "nanospec":
        assert stats["accepted_draft_tokens"] >= second_lap * 0.8
    else:  # only chance hits of the prefill candidates' 2nd and 3rd guesses remain
        assert stats["accepted_draft_tokens"] <= second_lap * 0.2


def test_bad_live_settings_are_refused_with_a_message(serve, token_map) -> None:
    with serve("agree-target", mode_flags("nanospec", "topk1", token_map)) as url:
        too_big = requests.post(
            f"{url}/nanospec/settings", json={"w_max": W_CAP + 1}, headers=ADMIN_HEADERS, timeout=60
        )
        # SGLang's app answers every invalid request with 400 and a message; so do we.
        assert too_big.status_code == 400 and "w_cap" in too_big.text, too_big.text
        negative = requests.post(
            f"{url}/nanospec/settings", json={"k_ver": -1}, headers=ADMIN_HEADERS, timeout=60
        )
        assert negative.status_code == 400 and "k_ver" in negative.text, negative.text
        unknown = requests.post(
            f"{url}/nanospec/settings", json={"w_min": 3}, headers=ADMIN_HEADERS, timeout=60
        )
        assert unknown.status_code == 400 and "w_min" in unknown.text, unknown.text
        assert requests.get(f"{url}/nanospec/settings", timeout=60).json()["w_max"] == W_MAX
        # the server still serves after the refusals
        assert generate(url, CHAIN_PROMPTS[1], 8)["output_ids"] == chain(CHAIN_PROMPTS[1][1], 9)[1:]
        stats = requests.get(f"{url}/stats/vocab", timeout=60).json()
        assert stats["settings"]["w_max"] == W_MAX and stats["requests"]


def test_random_target_is_lossless_under_nanospec(serve) -> None:
    """A context-dependent target, a draft that rarely agrees, a top-k 2 tree."""
    prompts = make_prompts(count=8, seed=5)
    with serve("tiny-target", []) as url:
        expected = [r["output_ids"] for r in generate_all(url, prompts)]
    flags = speculative_flags("EAGLE", "tiny-eagle", NUM_STEPS, 2, 6)
    with serve("tiny-target", flags + ["--nanospec-w-max", str(W_MAX)]) as url:
        got = [r["output_ids"] for r in generate_all(url, prompts)]
    assert got == expected
