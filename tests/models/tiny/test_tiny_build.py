"""The tiny test models: deterministic, loadable, and the agree-* pair agrees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from nanospec_server.models.tiny import TINY_MODELS, build_tiny_models, tiny_model_path
from nanospec_server.models.tiny.reference import eagle_logits, llama_logits
from nanospec_server.models.tiny.spec import DRAFT_SHAPE, TARGET_SHAPE
from nanospec_server.models.tiny.tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, VOCAB_SIZE
from nanospec_server.models.tiny.weights import SEEDS, agree_successor

VOCAB = torch.arange(VOCAB_SIZE)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_tiny_models(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module", autouse=True)
def _offline() -> None:
    # Everything must load without a network (and must not try to use one).
    os.environ["HF_HUB_OFFLINE"] = "1"


def _weights(path: Path, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) for k, v in load_file(path / "model.safetensors").items()}


def _file_hashes(root: Path) -> dict[str, str]:
    out = {}
    for name in TINY_MODELS:
        manifest = json.loads((root / name / "nanospec_tiny.json").read_text())
        out[name] = manifest["files"]
    return out


def test_build_is_deterministic_across_processes(models: dict[str, Path], tmp_path: Path) -> None:
    # A fresh process, so no in-process cache can hide nondeterminism.
    code = (
        "import sys; from pathlib import Path;"
        "from nanospec_server.models.tiny import build_tiny_models;"
        "build_tiny_models(Path(sys.argv[1]))"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True, timeout=120)
    first_root = models["tiny-target"].parent
    second_root = tmp_path / "tiny-models"
    assert _file_hashes(first_root) == _file_hashes(second_root)
    for name in TINY_MODELS:
        for file in ("model.safetensors", "config.json", "tokenizer.json"):
            assert (first_root / name / file).read_bytes() == (
                second_root / name / file
            ).read_bytes()


def test_reuses_a_complete_build(models: dict[str, Path]) -> None:
    weights = models["agree-target"] / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert (
        tiny_model_path("agree-target", models["agree-target"].parent.parent)
        == models["agree-target"]
    )
    assert weights.stat().st_mtime_ns == before
    assert not [p for p in models["agree-target"].parent.iterdir() if p.name.startswith(".")]


def test_rebuilds_an_incomplete_model(tmp_path: Path) -> None:
    broken = tmp_path / "tiny-models" / "tiny-standalone"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text("{}")  # no manifest: an interrupted build
    path = tiny_model_path("tiny-standalone", tmp_path)
    assert path == broken and (path / "model.safetensors").is_file()


def test_env_var_sets_cache_root(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NANOSPEC_CACHE", str(tmp_path))
    assert tiny_model_path("tiny-standalone") == tmp_path / "tiny-models" / "tiny-standalone"


def test_tokenizer_round_trip_and_chat_template(models: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models["tiny-target"])
    assert len(tok) == VOCAB_SIZE
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (BOS_ID, EOS_ID, PAD_ID)
    text = "The keeper lit the lamp. Ünïcödé, tabs\tand 🚀 emoji survive byte-level BPE!"
    ids = tok(text)["input_ids"]
    assert ids[0] == BOS_ID
    assert tok.decode(ids, skip_special_tokens=True) == text
    # Trained merges actually compress text from the corpus.
    assert len(tok("the lighthouse keeper", add_special_tokens=False)["input_ids"]) <= 6
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "<s>user: hi\nassistant: "
    for token in SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(token) == SPECIAL_TOKENS.index(token)


@pytest.mark.parametrize(
    "name", ["tiny-target", "tiny-standalone", "agree-target", "agree-standalone"]
)
def test_hf_loads_llama_models_and_matches_reference(models: dict[str, Path], name: str) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(models[name], dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == VOCAB_SIZE and not model.config.tie_word_embeddings
    shape = TINY_MODELS[name].shape
    ids = torch.tensor([5, 100, 996])
    with torch.no_grad():
        hf = model(ids[:, None]).logits[:, 0]  # three one-token sequences
    ours = llama_logits(_weights(models[name]), shape, ids)
    torch.testing.assert_close(hf, ours, atol=1e-3, rtol=1e-3)


def test_eagle_drafts_have_sglang_eagle_layout(models: dict[str, Path]) -> None:
    from transformers import AutoConfig

    for name in ("tiny-eagle", "agree-eagle"):
        config = AutoConfig.from_pretrained(models[name])
        assert config.architectures == ["LlamaForCausalLMEagle"]
        assert config.num_hidden_layers == 1 and config.vocab_size == VOCAB_SIZE
        weights = load_file(models[name] / "model.safetensors")
        target = load_file(models[TINY_MODELS[name].target] / "model.safetensors")
        h = config.hidden_size
        assert weights["fc.weight"].shape == (h, 2 * h) and weights["fc.bias"].shape == (h,)
        # SGLang's EAGLE layer 0 has no input_layernorm; lm_head comes from the target.
        assert not any(
            "input_layernorm" in k or k.startswith(("model.", "lm_head")) for k in weights
        )
        assert "layers.0.post_attention_layernorm.weight" in weights
        assert torch.equal(weights["embed_tokens.weight"], target["model.embed_tokens.weight"])
        assert all(t.dtype == torch.bfloat16 for t in weights.values())


def test_successor_map_is_one_long_cycle_of_regular_tokens() -> None:
    successor, _ = agree_successor(VOCAB_SIZE, SEEDS["agree-target"])
    assert int(successor.min()) >= len(SPECIAL_TOKENS)  # never predicts bos/eos/pad
    token, seen = BOS_ID, []
    for _ in range(VOCAB_SIZE):
        token = int(successor[token])
        seen.append(token)
    assert len(set(seen)) == VOCAB_SIZE - len(SPECIAL_TOKENS)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_agree_drafts_predict_the_target_token_for_every_id(
    models: dict[str, Path], dtype: torch.dtype
) -> None:
    successor, _ = agree_successor(VOCAB_SIZE, SEEDS["agree-target"])
    target = _weights(models["agree-target"], dtype)
    target_next = llama_logits(target, TARGET_SHAPE, VOCAB).argmax(-1)
    assert torch.equal(target_next, successor)

    standalone = _weights(models["agree-standalone"], dtype)
    assert torch.equal(llama_logits(standalone, DRAFT_SHAPE, VOCAB).argmax(-1), target_next)

    eagle = _weights(models["agree-eagle"], dtype)
    gen = torch.Generator().manual_seed(7)
    # The feature input (target or draft hidden state) must not matter.
    for features in (torch.zeros(VOCAB_SIZE, 64), torch.randn(VOCAB_SIZE, 64, generator=gen) * 10):
        logits = eagle_logits(
            eagle, DRAFT_SHAPE, target["lm_head.weight"], VOCAB, features.to(dtype)
        )
        assert torch.equal(logits.argmax(-1), target_next)


def test_agree_target_is_context_free_in_hf(models: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(models["agree-target"], dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, VOCAB_SIZE, (2, 300), generator=gen)
    with torch.no_grad():
        greedy = model(tokens).logits.argmax(-1)
    successor, _ = agree_successor(VOCAB_SIZE, SEEDS["agree-target"])
    assert torch.equal(greedy, successor[tokens])


def test_random_target_is_not_degenerate(models: dict[str, Path]) -> None:
    logits = llama_logits(_weights(models["tiny-target"]), TARGET_SHAPE, VOCAB)
    assert 1.5 < float(logits.std()) < 3.0  # LM_HEAD_GAIN: peaked but not one-hot
    assert logits.argmax(-1).unique().numel() > 100
