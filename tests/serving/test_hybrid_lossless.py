"""The hybrid vocabulary I ∪ P (`--nanospec-prior-k`) inside SGLang's real EAGLE worker.

Every dynamic mode stays token-identical to plain decoding with a prior, and the prior
does what it is for: with a window too short to hold the continuation, the agreeing
draft (it predicts the target exactly) is accepted far more often when the prior holds
the tokens the window lacks.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from nanospec_server.launch.server import generate, speculative_flags
from nanospec_server.models.tiny import tiny_model_path
from nanospec_server.models.tiny.tokenizer import VOCAB_SIZE
from nanospec_server.vocab_tools.prior import prior_token_ids
from tests.serving.conftest import generate_all, make_prompts
from tests.serving.test_nanospec_modes import CHAIN_PROMPTS, NUM_STEPS, PROMPTS

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

PRIOR_K, W_MAX = 256, 16
DYNAMIC_MODES = ["nanospec", "ctx-only", "ext-only", "sync"]


def hybrid_flags(mode: str, prior_k: int, w_max: int = W_MAX) -> list[str]:
    flags = speculative_flags("EAGLE", "agree-eagle", NUM_STEPS, 2, 6)
    return flags + ["--nanospec-mode", mode, "--nanospec-w-max", str(w_max),
                    "--nanospec-prior-k", str(prior_k)]  # fmt: skip


@pytest.fixture(scope="module")
def plain_outputs(serve) -> list[list[int]]:
    with serve("agree-target", []) as url:
        return [r["output_ids"] for r in generate_all(url, PROMPTS)]


@pytest.fixture(scope="module")
def prior() -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path("agree-target")))
    return prior_token_ids(tokenizer, PRIOR_K)


@pytest.mark.parametrize("mode", DYNAMIC_MODES)
def test_every_dynamic_mode_is_lossless_with_a_prior(serve, plain_outputs, prior, mode) -> None:
    with serve("agree-target", hybrid_flags(mode, PRIOR_K)) as url:
        results = generate_all(url, PROMPTS)
    for expected, result in zip(plain_outputs, results, strict=True):
        assert result["output_ids"] == expected
    for result in results:
        stats = result["meta_info"]["nanospec"][-1]
        eos_pinned = 1
        # the prior is in every active set; the window adds at most W_max more
        assert len(prior) <= stats["active_vocab_size"] <= W_MAX + len(prior) + eos_pinned


def test_random_target_is_lossless_with_a_prior(serve) -> None:
    prompts = make_prompts(count=8, seed=9)
    with serve("tiny-target", []) as url:
        expected = [r["output_ids"] for r in generate_all(url, prompts)]
    flags = speculative_flags("EAGLE", "tiny-eagle", NUM_STEPS, 2, 6)
    with serve("tiny-target", flags + ["--nanospec-prior-k", str(PRIOR_K)]) as url:
        got = [r["output_ids"] for r in generate_all(url, prompts)]
    assert got == expected


def test_the_prior_keeps_tokens_the_window_lost(serve) -> None:
    """All counted tokens as the prior against none, with a 4-entry window."""
    accept = {}
    for prior_k in (0, VOCAB_SIZE):
        with serve("agree-target", hybrid_flags("nanospec", prior_k, w_max=4)) as url:
            stats = [generate(url, p, 24)["meta_info"]["nanospec"][-1] for p in CHAIN_PROMPTS]
        accept[prior_k] = sum(s["accept_length_mean"] for s in stats) / len(stats)
    assert accept[VOCAB_SIZE] >= accept[0] + 1.0, accept
