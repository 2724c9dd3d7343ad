"""NanoSpec at --tp-size 2 on CPU: two scheduler ranks over gloo, one thread each.

Every configuration is token-identical to plain decoding at TP 1 and at TP 2. The draft
heads must also draft what they did at TP 1, which losslessness alone would not show
(the target verifies every token): the dynamic modes keep the agreeing draft's acceptance
on prompts that hold their continuation, and static mode accepts exactly as many tokens
as at TP 1 (SGLang's own token-map pruning at TP > 1 indexes a shard with global ids).

One server per configuration, many prompts each. CI runs a covering subset (the sharded
dynamic head with a tree, static with a token map); NANOSPEC_SLOW=1 runs every mode, both
trees, the hybrid prior, STANDALONE, and EAGLE-3 (static; dynamic refused).
"""

from __future__ import annotations

import os

import pytest
import torch

from nanospec_server.launch.server import ServerFailed, speculative_flags
from tests.serving.conftest import generate_all
from tests.serving.test_nanospec_modes import (
    CHAIN_PROMPTS,
    DYNAMIC,
    MAX_NEW,
    NUM_STEPS,
    PROMPTS,
    W_CAP,
    check_live_w_max,
    last_stats,
    mode_flags,
    token_map,  # noqa: F401 (fixture)
)

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

TP2 = ["--tp-size", "2"]
CI_CASES = [("nanospec", "topk2"), ("static", "topk1")]
SLOW_CASES = [
    (mode, tree)
    for mode in ["full", "static", "nanospec", "ctx-only", "ext-only", "sync"]
    for tree in ["topk1", "topk2"]
    if (mode, tree) not in CI_CASES
]
SLOW = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("NANOSPEC_SLOW") != "1", reason="NANOSPEC_SLOW=1"),
]
CASES = CI_CASES + [pytest.param(*case, marks=SLOW) for case in SLOW_CASES]


def outputs(url: str) -> list[list[int]]:
    return [r["output_ids"] for r in generate_all(url, PROMPTS, MAX_NEW)]


@pytest.fixture(scope="module")
def plain_tp1(serve) -> list[list[int]]:
    with serve("agree-target", []) as url:
        return outputs(url)


@pytest.fixture(scope="module")
def plain_tp2(serve, plain_tp1) -> list[list[int]]:
    with serve("agree-target", TP2) as url:
        got = outputs(url)
    assert got == plain_tp1  # plain decoding itself runs at TP 2
    return got


def accepted(url: str, prompts: list[list[int]]) -> list[int]:
    results = generate_all(url, prompts, [24] * len(prompts))
    return [last_stats(r)["accepted_draft_tokens"] for r in results]


@pytest.mark.parametrize(("mode", "tree"), CASES)
def test_tp2_is_lossless_and_drafts_as_at_tp1(serve, plain_tp2, token_map, mode, tree):  # noqa: F811
    flags = mode_flags(mode, tree, token_map)
    with serve("agree-target", flags + TP2) as url:
        assert outputs(url) == plain_tp2
        stats = last_stats(generate_all(url, PROMPTS[:1], MAX_NEW[:1])[0])
        assert stats["mode"] == mode and stats["draft_steps"] > 0
        if mode in DYNAMIC:
            check_live_w_max(url, mode)  # the sharded head drafts the window's tokens
        if mode == "static":
            static_tp2 = accepted(url, CHAIN_PROMPTS)
            check_static_rows(stats, token_map)
    if mode == "static":
        with serve("agree-target", flags) as url:
            assert accepted(url, CHAIN_PROMPTS) == static_tp2
        assert sum(static_tp2) > 0


def check_static_rows(stats: dict, token_map_path: str) -> None:
    """Each rank multiplies the map's tokens in its shard, padded to the fullest shard."""
    ids = torch.load(token_map_path)
    shard_rows = 512  # tiny vocabulary 997 -> padded to 1024 -> two shards of 512
    widest = int(torch.bincount(torch.as_tensor(ids) // shard_rows, minlength=2).max())
    assert stats["lm_head_rows_mean"] == 2 * widest


@pytest.mark.slow
@SLOW[1]
def test_tp2_hybrid_prior_is_lossless(serve, plain_tp2) -> None:
    flags = speculative_flags("EAGLE", "agree-eagle", NUM_STEPS, 2, 6)
    flags += ["--nanospec-mode", "nanospec", "--nanospec-prior-k", "32"]
    with serve("agree-target", flags + ["--nanospec-w-max", str(W_CAP)] + TP2) as url:
        assert outputs(url) == plain_tp2


@pytest.mark.slow
@SLOW[1]
@pytest.mark.parametrize("mode", ["static", "nanospec"])
def test_tp2_standalone_is_lossless(serve, plain_tp2, token_map, mode) -> None:  # noqa: F811
    flags = speculative_flags("STANDALONE", "agree-standalone", NUM_STEPS, 1, NUM_STEPS + 1)
    flags += ["--nanospec-mode", mode]
    flags += ["--speculative-token-map", token_map] if mode == "static" else []
    with serve("agree-target", flags + TP2) as url:
        assert outputs(url) == plain_tp2


def eagle3_flags(mode: str) -> list[str]:
    flags = speculative_flags("EAGLE3", "tiny-eagle3", NUM_STEPS, 2, 6)
    return flags + ["--nanospec-mode", mode] + TP2


@pytest.mark.slow
@SLOW[1]
def test_tp2_eagle3_static_is_lossless_and_dynamic_is_refused(serve) -> None:
    """A pruned EAGLE-3 head is sharded over its own D by SGLang and gathered whole, so
    its d2t list applies as at TP 1; its dynamic modes are refused, naming the flag."""
    with serve("tiny-target", []) as url:
        expected = outputs(url)
    with serve("tiny-target", eagle3_flags("static")) as url:
        assert outputs(url) == expected
    with pytest.raises(ServerFailed, match="--tp-size 2"):
        with serve("tiny-target", eagle3_flags("nanospec")):
            pass
