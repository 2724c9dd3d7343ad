"""A token map from `nanospec vocab trim` served in `static` mode by SGLang's real EAGLE
worker: greedy output token-identical to plain decoding, the head over the map's rows."""

from __future__ import annotations

import pytest
import torch

from nanospec_server.cli import main
from nanospec_server.launch.server import speculative_flags
from nanospec_server.models.tiny import tiny_model_path
from nanospec_server.models.tiny.tokenizer import CORPUS_PATH, VOCAB_SIZE
from tests.serving.conftest import generate_waves, make_prompts
from tests.serving.test_nanospec_modes import CHAIN_PROMPTS, MAX_NEW, NUM_STEPS, PROMPTS

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200)]

PAIRS = {"agree": PROMPTS, "tiny": make_prompts(count=8, seed=5) + CHAIN_PROMPTS}


@pytest.fixture(scope="module")
def trimmed_map(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("trim") / "trimmed.pt"
    argv = ["vocab", "trim", "--tokenizer", str(tiny_model_path("agree-target")),
            "--draft-config", str(tiny_model_path("agree-eagle")), "--answers", str(CORPUS_PATH),
            "--min-coverage", "0.9", "--trials", "30", "--output", str(path)]  # fmt: skip
    assert main(argv) == 0
    return str(path)


@pytest.mark.parametrize("pair", PAIRS)
def test_a_trimmed_map_serves_losslessly(serve, trimmed_map: str, pair: str) -> None:
    ids = torch.load(trimmed_map)
    assert len(ids) < VOCAB_SIZE  # trimmed: the draft cannot propose every token
    prompts = PAIRS[pair]
    with serve(f"{pair}-target", []) as url:
        expected = [r["output_ids"] for r in generate_waves(url, prompts, MAX_NEW)]
    flags = speculative_flags("EAGLE", f"{pair}-eagle", NUM_STEPS, 2, 6)
    flags += ["--nanospec-mode", "static", "--speculative-token-map", trimmed_map]
    with serve(f"{pair}-target", flags) as url:
        results = generate_waves(url, prompts, MAX_NEW)
    assert [r["output_ids"] for r in results] == expected
    stats = results[0]["meta_info"]["nanospec"][-1]
    assert stats["mode"] == "static" and stats["lm_head_rows_mean"] == len(ids)
