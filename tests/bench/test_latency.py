"""Table 4's breakdown runs on a STANDALONE draft and on an EAGLE head built from its parts."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from nanospec_server.bench import latency
from nanospec_server.models.tiny import tiny_model_path

PARTS = ("backbone", "head_full", "head_static", "head_packed", "gather", "state_update")


def load(name: str):
    path = tiny_model_path(name)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def stream(vocab_size: int, length: int) -> list[int]:
    return torch.randint(
        0, vocab_size, (length,), generator=torch.Generator().manual_seed(0)
    ).tolist()


def check(result: dict, w_max: int) -> None:
    assert all(result[p] > 0 for p in PARTS)
    assert 0 < result["packed_rows_mean"] <= w_max
    for totals in latency.step_totals(result).values():
        assert 0 < totals["lm_head_share"] < 1


def test_standalone_breakdown() -> None:
    model = load("tiny-standalone")
    vocab = model.lm_head.weight.shape[0]
    result = latency.breakdown(model, stream(vocab, 64 + 3 * 20 + 32), 64, 3, 32, 256)
    check(result, 64)
    assert result["eagle"] is False and result["dtype"] == "float32"
    assert result["static_k"] == min(256, vocab)


def test_eagle_draft_is_the_heads_layer_and_fc_on_the_targets_embedding_and_head() -> None:
    target = load("tiny-target")
    head_dir = tiny_model_path("tiny-eagle")
    model, fc = latency.eagle_draft(head_dir, target, torch.float32)
    state = load_file(str(head_dir / "model.safetensors"))
    layer = model.model.layers[0].state_dict()
    for key, value in state.items():
        if key.startswith("layers.0."):
            assert torch.equal(layer[key.removeprefix("layers.0.")], value.float()), key
    assert torch.equal(fc.weight, state["fc.weight"].float())
    assert model.lm_head.weight is target.lm_head.weight
    assert model.model.embed_tokens.weight is target.get_input_embeddings().weight
    vocab = target.lm_head.weight.shape[0]
    result = latency.breakdown(model, stream(vocab, 64 + 3 * 20 + 32), 64, 3, 32, 256, fc)
    check(result, 64)
    assert result["eagle"] is True


def test_eagle_draft_refuses_a_model_that_is_not_a_head() -> None:
    with pytest.raises(ValueError, match="not an EAGLE head"):
        latency.eagle_draft(tiny_model_path("tiny-target"), load("tiny-target"), torch.float32)
