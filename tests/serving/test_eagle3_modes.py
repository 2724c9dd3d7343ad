"""EAGLE-3 heads in every mode inside SGLang's real EAGLE-3 worker: lossless, with stats.

Two random EAGLE-3 heads for the context-dependent tiny target: ``tiny-eagle3`` drafts
over a pruned d2t vocabulary D (512 of 997 tokens), ``tiny-eagle3-full`` over every token.
Each case is one server; one plain server is the reference for all of them. The default
run is a covering set of 6 cases (``DEFAULT_CASES``); ``NANOSPEC_SLOW=1`` runs every
(head, mode, tree) case, 26 of them.
"""

from __future__ import annotations

import os
from functools import cache

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from nanospec_server.launch.server import ServerFailed, speculative_flags
from nanospec_server.models.tiny import tiny_model_path
from nanospec_server.models.tiny.spec import PRUNED_DRAFT_VOCAB
from nanospec_server.models.tiny.tokenizer import EOS_ID, VOCAB_SIZE
from nanospec_server.vocab_tools.prior import prior_token_ids
from tests.serving import conftest
from tests.serving.conftest import make_prompts

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

HEADS = {"pruned": "tiny-eagle3", "full": "tiny-eagle3-full"}
HEAD_ROWS = {"pruned": PRUNED_DRAFT_VOCAB, "full": VOCAB_SIZE}
TREES = {"topk1": (1, 4), "topk2": (2, 6)}
NUM_STEPS, W_MAX, PRIOR_K = 3, 64, 32
MODES = ["full", "static", "nanospec", "ctx-only", "ext-only", "sync", "prior"]
DYNAMIC = {"nanospec", "ctx-only", "ext-only", "sync", "prior"}
# Random prompts, several longer than W_max; different lengths so that requests finish
# while others run, and a second wave that takes over their slots.
PROMPTS = make_prompts(count=8, seed=19)
MAX_NEW = [6 + 4 * (i % 4) for i in range(len(PROMPTS))]
# Both heads, both trees, each head with a dynamic mode on each tree, and every mode but
# two: sync drafts exactly as nanospec on a CPU (it differs in CUDA streams only), and
# ctx-only serves the pruned head in tests/sglang_plugin/spec/test_eagle3.py.
DEFAULT_CASES = {
    ("pruned", "nanospec", "topk1"),
    ("pruned", "prior", "topk2"),
    ("pruned", "static", "topk2"),
    ("full", "full", "topk1"),
    ("full", "nanospec", "topk2"),
    ("full", "ext-only", "topk1"),
}
SLOW = pytest.mark.skipif(os.environ.get("NANOSPEC_SLOW") != "1", reason="NANOSPEC_SLOW=1")


@cache
def head_vocabulary(head: str) -> frozenset[int]:
    """D as the checkpoint states it (d2t + arange), or every token without a d2t."""
    tensors = load_file(str(tiny_model_path(HEADS[head]) / "model.safetensors"))
    if "d2t" not in tensors:
        return frozenset(range(VOCAB_SIZE))
    return frozenset((tensors["d2t"] + torch.arange(len(tensors["d2t"]))).tolist())


@cache
def pinned_in_head(head: str, mode: str) -> int:
    """Rows pinned in every active set: EOS and, with the prior, P, as far as D holds them."""
    pinned = {EOS_ID}
    if mode == "prior":
        tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path("tiny-target")))
        pinned |= set(prior_token_ids(tokenizer, PRIOR_K))
    return len(pinned & head_vocabulary(head))


def cases() -> list:
    every = [
        (head, mode, tree)
        for head in HEADS
        for mode in MODES
        for tree in TREES
        if not (head == "full" and mode == "static")  # refused: see the test below
    ]
    return [
        pytest.param(*case, marks=() if case in DEFAULT_CASES else SLOW, id="-".join(case))
        for case in every
    ]


def eagle3_flags(head: str, mode: str, tree: str) -> list[str]:
    topk, tokens = TREES[tree]
    flags = speculative_flags("EAGLE3", HEADS[head], NUM_STEPS, topk, tokens)
    flags += ["--nanospec-w-max", str(W_MAX), "--nanospec-w-cap", str(W_MAX)]
    if mode == "prior":
        return flags + ["--nanospec-mode", "nanospec", "--nanospec-prior-k", str(PRIOR_K)]
    return flags + ["--nanospec-mode", mode]


def generate_waves(url: str) -> list[dict]:
    return conftest.generate_waves(url, PROMPTS, MAX_NEW)


@pytest.fixture(scope="module")
def plain_outputs(serve) -> list[list[int]]:
    with serve("tiny-target", []) as url:
        return [r["output_ids"] for r in generate_waves(url)]


@pytest.mark.parametrize(("head", "mode", "tree"), cases())
def test_eagle3_mode_is_lossless_with_consistent_stats(
    serve, plain_outputs, head: str, mode: str, tree: str
) -> None:
    with serve("tiny-target", eagle3_flags(head, mode, tree)) as url:
        results = generate_waves(url)
    for expected, result in zip(plain_outputs, results, strict=True):
        assert result["output_ids"] == expected
    stats = [result["meta_info"]["nanospec"][-1] for result in results]
    for entry in stats:
        check_stats(entry, head, mode)
    head_coverage = sum(s["covered_by_head_tokens"] for s in stats)
    emitted = sum(s["emitted_tokens"] for s in stats)
    if head == "pruned":  # the random target emits tokens outside D, and the stats say so
        assert head_coverage < emitted
    else:
        assert head_coverage == emitted


def check_stats(stats: dict, head: str, mode: str) -> None:
    rows = HEAD_ROWS[head]
    assert stats["mode"] == ("nanospec" if mode == "prior" else mode)
    assert stats["draft_steps"] > 0
    assert 1.0 <= stats["accept_length_mean"] <= NUM_STEPS + 1
    # Coverage by I ∩ D can never exceed coverage by D.
    assert 0.0 <= stats["coverage"] <= stats["head_vocab_coverage"] <= 1.0
    if mode in DYNAMIC:
        pinned = pinned_in_head(head, mode)
        assert pinned <= stats["active_vocab_size"] <= stats["active_vocab_max"] <= W_MAX + pinned
        assert stats["lm_head_rows_mean"] < rows
    else:  # stock SGLang: the head's own rows, D (static means D for an EAGLE-3 head)
        assert stats["lm_head_rows_mean"] == rows
        assert stats["active_vocab_size"] == rows
        assert stats["coverage"] == stats["head_vocab_coverage"]


def test_static_mode_without_d2t_is_refused_naming_the_flag(serve) -> None:
    """SGLang ignores --speculative-token-map under EAGLE-3, so a full-vocabulary head has
    no list for static mode: the server refuses to start and says why."""
    with pytest.raises(ServerFailed, match="--nanospec-mode static"):
        with serve("tiny-target", eagle3_flags("full", "static", "topk1")):
            pass
