"""Speculative greedy decoding on a CPU, in fp32 and in bf16, is bit-identical to plain
decoding of the same dtype.

Not only the tokens: every output token's log-probability is the same float, so the
target computed the same logits at every position whether it decoded the position alone
or verified it inside a draft tree, beside other requests, after a prompt prefilled in
other chunks. With that, any token that differs is a bug, never a near-tie.

The random tiny target (no agreeing draft) gives logits with no structure to hide behind;
the speculative servers prefill in 48-token chunks while plain decoding takes each prompt
whole, and two waves of concurrent requests batch them differently. bf16 runs a tree of
each draft kind; its STANDALONE draft serves `wide-target`, whose 1536-wide layers are
where a bf16 linear layer's rounding can depend on the rows beside a row.
"""

from __future__ import annotations

from collections.abc import Callable
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

# (dtype, target, config)
CASES = [("float32", "tiny-target", name) for name in CONFIGS] + [
    ("bfloat16", "tiny-target", "eagle-topk2-nanospec"),
    ("bfloat16", "tiny-target", "eagle3-pruned-topk2-nanospec"),
    ("bfloat16", "wide-target", "standalone-topk2-sync"),
]

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
def plain(serve) -> Callable[[str, str], list[Answer]]:
    """Plain decoding's answers of a (dtype, target), served once each."""
    answered: dict[tuple[str, str], list[Answer]] = {}

    def of(dtype: str, target: str) -> list[Answer]:
        if (dtype, target) not in answered:
            with serve(target, ["--dtype", dtype]) as url:
                answered[dtype, target] = answers(url)
        return answered[dtype, target]

    return of


@pytest.mark.parametrize("dtype,target", sorted({case[:2] for case in CASES}))
def test_plain_decoding_is_itself_batch_invariant(plain, dtype: str, target: str) -> None:
    # Each prompt alone in its wave's batch position: both waves agree bit for bit.
    half = len(PROMPTS)
    answered = plain(dtype, target)
    for first, second in zip(answered[:half], answered[half:], strict=True):
        assert first[:2] == second[:2]


@pytest.mark.parametrize("dtype,target,config", CASES)
def test_speculative_logprobs_are_bitwise_plain(
    serve, plain, dtype: str, target: str, config: str
) -> None:
    with serve(target, CONFIGS[config] + CHUNKED + ["--dtype", dtype]) as url:
        speculative = answers(url)
    expected_answers = plain(dtype, target)
    for index, (expected, got) in enumerate(zip(expected_answers, speculative, strict=True)):
        ids, logprobs, verify_steps = got
        assert verify_steps > 0, "speculation did not run"
        assert ids == expected[0], f"request {index}: tokens differ"
        assert len(logprobs) == len(expected[1])
        for position, (want, have) in enumerate(zip(expected[1], logprobs, strict=True)):
            assert want == have, f"request {index}, token {position}: {want!r} != {have!r}"
