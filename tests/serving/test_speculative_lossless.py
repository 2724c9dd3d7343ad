"""SGLang's real scheduler and speculative workers on this CPU: greedy output with
speculation is token-identical to plain decoding, and an agreeing draft is fully accepted.

These run stock EAGLE/STANDALONE (`--nanospec-mode full`): the foundation under our modes.
"""

from __future__ import annotations

import pytest

from nanospec_server.launch.server import speculative_flags
from tests.serving.conftest import generate_all, make_prompts

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

PROMPTS = make_prompts(count=10, seed=7)


def stock(algorithm: str, draft: str, steps: int, topk: int, tokens: int) -> list[str]:
    return speculative_flags(algorithm, draft, steps, topk, tokens) + ["--nanospec-mode", "full"]


SPECULATIVE_CONFIGS = {
    "eagle-topk1": ("tiny-target", stock("EAGLE", "tiny-eagle", 3, 1, 4)),
    "eagle-topk2": ("tiny-target", stock("EAGLE", "tiny-eagle", 3, 2, 6)),
    "standalone-topk2": (
        "tiny-target",
        stock("STANDALONE", "tiny-standalone", 3, 2, 6),
    ),
    "agree-eagle": ("agree-target", stock("EAGLE", "agree-eagle", 3, 1, 4)),
    "agree-standalone-topk2": (
        "agree-target",
        stock("STANDALONE", "agree-standalone", 3, 2, 6),
    ),
}


@pytest.fixture(scope="module")
def plain_outputs(serve) -> dict[str, list[list[int]]]:
    outputs = {}
    for target in ("tiny-target", "agree-target"):
        with serve(target, []) as url:
            outputs[target] = [r["output_ids"] for r in generate_all(url, PROMPTS)]
    return outputs


def test_plain_decoding_answers(plain_outputs) -> None:
    for outputs in plain_outputs.values():
        assert all(len(ids) > 0 for ids in outputs)
    # the random target must not be degenerate, or identity checks would prove little
    assert len({tuple(ids) for ids in plain_outputs["tiny-target"]}) == len(PROMPTS)


@pytest.mark.parametrize("config", SPECULATIVE_CONFIGS)
def test_speculative_greedy_is_token_identical(serve, plain_outputs, config: str) -> None:
    target, flags = SPECULATIVE_CONFIGS[config]
    with serve(target, flags) as url:
        results = generate_all(url, PROMPTS)
    for prompt, expected, result in zip(PROMPTS, plain_outputs[target], results, strict=True):
        assert result["output_ids"] == expected, f"prompt of length {len(prompt)} diverged"
        assert result["meta_info"]["spec_verify_ct"] > 0, "speculation did not run"
    if target == "agree-target":
        steps = 3
        accept = [r["meta_info"]["spec_accept_length"] for r in results]
        # every draft token is accepted; the last step may be cut by max_new_tokens
        assert min(accept) >= steps + 0.5, accept
