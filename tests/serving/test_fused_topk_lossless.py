"""The fused draft top-k inside SGLang's real EAGLE draft loop, on this CPU.

NANOSPEC_STATIC_SHAPES=1 with TRITON_INTERPRET=1 puts the CUDA path on the CPU: a fixed
union buffer wider than the live union, the Triton window refresh and union kernels, and
in the draft loop the packed head returning the top-k carrier that our hooks hand to
SGLang's `renorm_draft_probs` / `fast_topk` (a top-k 2 tree: SGLang's CPU chain takes an
inline argmax, see packed_head.py). Greedy output must equal plain decoding, and the
agreeing draft must keep its acceptance: wrong rows or probabilities from the carrier
would keep the output (the target verifies) but lose the acceptance.
"""

from __future__ import annotations

import pytest

from nanospec_server.launch.server import running_server, speculative_flags
from nanospec_server.models.tiny import tiny_model_path
from tests.serving.conftest import BASE_FLAGS, generate_all
from tests.serving.test_nanospec_modes import CHAIN_PROMPTS, NUM_STEPS

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]

W = 256  # W_max = W_cap: the window keeps a chain prompt and its prefill candidates
CAPACITY = 900  # union buffer rows: below V = 997, above the live union of 4 requests
MAX_NEW = 24


def serve(tmp_path, name: str, flags: list[str]):
    model = ["--model-path", str(tiny_model_path("agree-target"))]
    return running_server(model + BASE_FLAGS + flags, tmp_path / f"{name}.log")


def test_fused_draft_topk_is_lossless_and_keeps_acceptance(tmp_path, monkeypatch) -> None:
    prompts = CHAIN_PROMPTS[:4]
    with serve(tmp_path, "plain", []) as url:
        expected = [r["output_ids"] for r in generate_all(url, prompts, MAX_NEW)]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("NANOSPEC_OPS", "triton")
    monkeypatch.setenv("NANOSPEC_STATIC_SHAPES", "1")
    flags = speculative_flags("EAGLE", "agree-eagle", NUM_STEPS, 2, 6)
    flags += ["--nanospec-w-max", str(W), "--nanospec-w-cap", str(W)]
    flags += ["--nanospec-union-capacity", str(CAPACITY)]
    with serve(tmp_path, "fused", flags) as url:
        results = generate_all(url, prompts, MAX_NEW)
    assert [r["output_ids"] for r in results] == expected
    log = (tmp_path / "fused.log").read_text()
    assert "draft top-k fused into the packed head" in log, log[-3000:]
    accept = [r["meta_info"]["nanospec"][-1]["accept_length_mean"] for r in results]
    assert min(accept) >= NUM_STEPS + 0.5, accept
