"""The agree-* pair in a real SGLang engine: every draft token is accepted.

Starts one CPU engine per draft kind (~45 s each on 2 cores), so it only runs
with NANOSPEC_SLOW=1.
"""

from __future__ import annotations

import os

import pytest

from nanospec_server.host import prepare_cpu_environment
from nanospec_server.models.tiny import tiny_model_path
from nanospec_server.models.tiny.tokenizer import BOS_ID, VOCAB_SIZE
from nanospec_server.models.tiny.weights import SEEDS, agree_successor

pytestmark = [
    pytest.mark.slow,
    pytest.mark.engine,
    pytest.mark.skipif(os.environ.get("NANOSPEC_SLOW") != "1", reason="set NANOSPEC_SLOW=1"),
]

NUM_STEPS = 3


def _expected_chain(last_token: int, length: int) -> list[int]:
    successor, _ = agree_successor(VOCAB_SIZE, SEEDS["agree-target"])
    chain = []
    for _ in range(length):
        last_token = int(successor[last_token])
        chain.append(last_token)
    return chain


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("algorithm", "draft"), [("EAGLE", "agree-eagle"), ("STANDALONE", "agree-standalone")]
)
def test_greedy_acceptance_is_num_steps_plus_one(algorithm: str, draft: str) -> None:
    prepare_cpu_environment()
    import sglang

    engine = sglang.Engine(
        model_path=str(tiny_model_path("agree-target")),
        speculative_algorithm=algorithm,
        speculative_draft_model_path=str(tiny_model_path(draft)),
        speculative_num_steps=NUM_STEPS,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=NUM_STEPS + 1,
        device="cpu",
        attention_backend="torch_native",
        prefill_attention_backend="intel_amx",
        decode_attention_backend="intel_amx",
        disable_cuda_graph=True,
        max_total_tokens=4096,
        mem_fraction_static=0.3,
    )
    try:
        prompts = [[BOS_ID, 5, 17, 300], [BOS_ID, 42]]
        outputs = engine.generate(
            input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 40}
        )
    finally:
        engine.shutdown()
    for prompt, output in zip(prompts, outputs, strict=True):
        assert output["output_ids"] == _expected_chain(prompt[-1], 40)
        meta = output["meta_info"]
        assert meta["spec_accept_length"] == NUM_STEPS + 1
        assert meta["spec_accept_rate"] == 1.0
