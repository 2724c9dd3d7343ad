"""Speculative greedy decoding on a CPU in fp32 is bit-identical to plain decoding.

Not only the tokens: every output token's log-probability is the same float, so the
target computed the same logits at every position whether it decoded the position alone
or verified it inside a draft tree, beside other requests, after a prompt prefilled in
other chunks. With that, any token that differs is a bug, never a near-tie.

The random tiny target (no agreeing draft) gives logits with no structure to hide behind;
the speculative servers prefill in 48-token chunks while plain decoding takes each prompt
whole, and two waves of concurrent requests batch them differently.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from nanospec_server.launch.server import generate, speculative_flags
from tests.serving.conftest import make_prompts

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]

PROMPTS = make_prompts(count=10, seed=23)
MAX_NEW = [72 + 8 * (i % 4) for i in range(len(PROMPTS))]  # requests finish at different steps
CHUNKED = ["--chunked-prefill-size", "48"]
CONFIGS = {
    "eagle-topk1-nanospec": speculative_flags("EAGLE", "tiny-eagle", 3, 1, 4)
    + ["--nanospec-mode", "nanospec", "--nanospec-w-max", "48"],
    "eagle-topk2-nanospec": speculative_flags("EAGLE", "tiny-eagle", 3, 2, 6)
    + ["--nanospec-mode", "nanospec", "--nanospec-w-max", "48", "--nanospec-prior-k", "32"],
    "eagle-topk2-full": speculative_flags("EAGLE", "tiny-eagle", 3, 2, 6)
    + ["--nanospec-mode", "full"],
    "standalone-topk2-sync": speculative_flags("STANDALONE", "tiny-standalone", 3, 2, 6)
    + ["--nanospec-mode", "sync"],
    "eagle3-pruned-topk2-nanospec": speculative_flags("EAGLE3", "tiny-eagle3", 3, 2, 6)
    + ["--nanospec-mode", "nanospec", "--nanospec-w-max", "48"],
}


Answer = tuple[list[int], list[float], int]


def answers(url: str) -> list[Answer]:
    """Two waves of concurrent requests, the second in reverse order; per prompt of the
    first wave, then of the second: (output ids, output logprobs, verify steps)."""
    results = []
    for order in (range(len(PROMPTS)), reversed(range(len(PROMPTS)))):
        order = list(order)
        with ThreadPoolExecutor(max_workers=len(order)) as pool:
            wave = list(
                pool.map(
                    lambda i: generate(url, PROMPTS[i], MAX_NEW[i], return_logprob=True), order
                )
            )
        by_prompt = dict(zip(order, wave, strict=True))
        for i in range(len(PROMPTS)):
            meta = by_prompt[i]["meta_info"]
            logprobs = [entry[0] for entry in meta["output_token_logprobs"]]
            results.append((by_prompt[i]["output_ids"], logprobs, meta.get("spec_verify_ct", 0)))
    return results


@pytest.fixture(scope="module")
def plain(serve) -> list[Answer]:
    with serve("tiny-target", []) as url:
        return answers(url)


def test_plain_decoding_is_itself_batch_invariant(plain) -> None:
    # Each prompt alone in its wave's batch position: both waves agree bit for bit.
    half = len(PROMPTS)
    for first, second in zip(plain[:half], plain[half:], strict=True):
        assert first[:2] == second[:2]


@pytest.mark.parametrize("config", CONFIGS)
def test_speculative_logprobs_are_bitwise_plain(serve, plain, config: str) -> None:
    with serve("tiny-target", CONFIGS[config] + CHUNKED) as url:
        speculative = answers(url)
    for index, (expected, got) in enumerate(zip(plain, speculative, strict=True)):
        ids, logprobs, verify_steps = got
        assert verify_steps > 0, "speculation did not run"
        assert ids == expected[0], f"request {index}: tokens differ"
        assert len(logprobs) == len(expected[1])
        for position, (want, have) in enumerate(zip(expected[1], logprobs, strict=True)):
            assert want == have, f"request {index}, token {position}: {want!r} != {have!r}"
