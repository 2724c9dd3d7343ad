"""`nanospec train-eagle` on the tiny target: the head computes what SGLang's EAGLE
draft computes, training lowers the loss, the export is a directory SGLang serves
losslessly. A slow test does the same on Qwen2.5-Coder-0.5B."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from nanospec_server.models.tiny import tiny_model_path
from nanospec_server.models.tiny_reference import eagle_logits
from nanospec_server.models.tiny_spec import DRAFT_SHAPE
from nanospec_server.train.cli import add_train_command, recipe_key
from nanospec_server.train.corpus import Split, corpus_files
from nanospec_server.train.head import EagleHead, HeadConfig
from nanospec_server.train.target import read_config

TINY_ARGS = ["--tokens", "32768", "--val-tokens", "1024", "--seq-len", "128", "--steps", "300",
             "--lr", "3e-3"]  # fmt: skip
NEW_TOKENS = 32
EXPECTED_TENSORS = {
    "fc.weight", "fc.bias",
    "layers.0.self_attn.q_proj.weight", "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight", "layers.0.self_attn.o_proj.weight",
    "layers.0.mlp.gate_proj.weight", "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight", "layers.0.post_attention_layernorm.weight",
}  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nanospec")
    add_train_command(parser.add_subparsers(dest="command", required=True))
    return parser


def _run_cli(argv: list[str]) -> None:
    args = _parser().parse_args(["train-eagle", *argv])
    assert args.func(args) == 0


def test_head_matches_the_sglang_draft_reference() -> None:
    """Our module with tiny-eagle's weights gives the logits of the independent
    reference of SGLang's LlamaForCausalLMEagle (one-token sequences)."""
    target = load_file(str(tiny_model_path("tiny-target") / "model.safetensors"))
    draft = {k: v.float() for k, v in load_file(str(tiny_model_path("tiny-eagle") / "model.safetensors")).items()}  # fmt: skip
    head = EagleHead(HeadConfig.from_target(read_config(tiny_model_path("tiny-target"))))
    head.load_state_dict({k: v for k, v in draft.items() if k != "embed_tokens.weight"})
    tokens = torch.arange(3, 40)
    features = torch.randn(len(tokens), DRAFT_SHAPE.hidden_size, generator=torch.Generator().manual_seed(0))  # fmt: skip
    lm_head = target["lm_head.weight"].float()
    embeds = draft["embed_tokens.weight"][tokens]
    ours = head(embeds[:, None], features[:, None], torch.zeros(1, dtype=torch.long))[:, 0] @ lm_head.T  # fmt: skip
    expected = eagle_logits(draft, DRAFT_SHAPE, lm_head, tokens, features)
    torch.testing.assert_close(ours, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--output", "x"], "--target"),
        (["--target", "t", "--output", "x", "--steps", "0"], "--steps"),
        (["--target", "t", "--output", "x", "--seq-len", "1"], "--seq-len"),
        (["--target", "t", "--output", "x", "--lr", "-1"], "--lr"),
        (["--target", "t", "--output", "x", "--tokens", "many"], "--tokens"),
        (["--target", "t", "--output", "x", "--device", "tpu"], "--device"),
    ],
)
def test_bad_flags_are_argparse_errors(argv: list[str], flag: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(["train-eagle", *argv])
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err


def test_recipe_key_accepts_registry_names_and_prepared_paths() -> None:
    name = "qwen2.5-coder-0.5b-instruct"
    assert recipe_key(name) == name
    assert recipe_key(f"/cache/models/{name}/hf") == name
    assert recipe_key("/somewhere/else") == "/somewhere/else"


def test_corpus_split_is_by_file_and_deterministic() -> None:
    train, val = corpus_files(Split.TRAIN), corpus_files(Split.VAL)
    assert len(val) > 10 and len(train) > 10 * len(val) // 2
    assert not set(train) & set(val)
    assert corpus_files(Split.VAL) == val


@pytest.fixture(scope="module")
def tiny_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("train")
    output = root / "head"
    target = str(tiny_model_path("tiny-target"))
    _run_cli(["--target", target, "--output", str(output), "--cache-dir", str(root / "cache"),
              *TINY_ARGS])  # fmt: skip
    return output


def test_training_lowers_the_loss(tiny_head: Path) -> None:
    losses = json.loads((tiny_head / "train_loss.json").read_text())
    assert len(losses) == 300
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5]), losses
    evals = json.loads((tiny_head / "nanospec_head.json").read_text())["evals"]
    assert evals[-1]["regression"] < evals[0]["regression"]
    assert evals[-1]["top1"] > evals[0]["top1"] + 0.1, evals


def test_export_is_an_sglang_eagle_checkpoint(tiny_head: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tiny_head / name).is_file(), name
    config = json.loads((tiny_head / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle"]
    assert config["num_hidden_layers"] == 1
    assert config["hidden_size"] == read_config(tiny_model_path("tiny-target"))["hidden_size"]
    with safe_open(str(tiny_head / "model.safetensors"), framework="pt") as handle:
        assert set(handle.keys()) == EXPECTED_TENSORS  # no input_layernorm, no embed/lm_head
        assert handle.get_tensor("fc.weight").dtype == torch.bfloat16


def _prompts(tokenizer_dir: Path, count: int, length: int) -> list[list[int]]:
    """In-distribution prompts: the start of held-out stdlib files."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    files = corpus_files(Split.VAL)[:count]
    return [tokenizer(f.read_text()[:4000], add_special_tokens=False)["input_ids"][:length] for f in files]  # fmt: skip


def _hf_greedy(model_dir: Path, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Plain greedy decoding with transformers, fp32 (the reference SGLang must match)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    outputs = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = list(prompt)
            for _ in range(new_tokens):  # no EOS stop: the server runs with ignore_eos
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            outputs.append(ids[len(prompt) :])
    return outputs


def _serve_flags(draft: Path, mode: str) -> list[str]:
    return [
        "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", str(draft),
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "4", "--nanospec-mode", mode,
    ]  # fmt: skip


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_sglang_serves_the_trained_head_losslessly(tiny_head: Path, tmp_path: Path) -> None:
    from nanospec_server.bench.server import generate, running_server

    target = tiny_model_path("tiny-target")
    prompts = _prompts(target, count=6, length=80)
    expected = _hf_greedy(target, prompts, NEW_TOKENS)
    base = ["--model-path", str(target), "--max-total-tokens", "8192",
            "--mem-fraction-static", "0.3", "--dtype", "float32"]  # fmt: skip
    with running_server(base + _serve_flags(tiny_head, "nanospec"), tmp_path / "s.log") as url:
        results = [generate(url, prompt, NEW_TOKENS, ignore_eos=True) for prompt in prompts]
    for want, result in zip(expected, results, strict=True):
        assert result["output_ids"] == want
        assert result["meta_info"]["spec_verify_ct"] > 0
    accept = [r["meta_info"]["spec_accept_length"] for r in results]
    print(f"trained tiny head acceptance lengths: {accept}")
    # Random tiny-eagle gets ~1.04 on these prompts; a head SGLang computed differently
    # from training would too. Trained for 300 steps it gets ~1.36 (measured).
    assert sum(accept) / len(accept) > 1.1, accept


SLOW = pytest.mark.skipif(os.environ.get("NANOSPEC_SLOW") != "1", reason="NANOSPEC_SLOW=1")


@SLOW
@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.timeout(3600)
def test_real_target_head_trains_and_serves(tmp_path: Path) -> None:
    """A few-minute head for Qwen2.5-Coder-0.5B: trains, loads in SGLang, stays lossless."""
    from nanospec_server.bench.server import generate, running_server
    from nanospec_server.models.prepare import prepare_model

    name = "qwen2.5-coder-0.5b-instruct"
    target = prepare_model(name)
    head = tmp_path / "head"
    _run_cli(["--target", name, "--output", str(head), "--cache-dir", str(tmp_path / "cache"),
              "--tokens", "4096", "--val-tokens", "512", "--seq-len", "256", "--steps", "20"])  # fmt: skip
    config = json.loads((head / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLMEagle"]
    with safe_open(str(head / "model.safetensors"), framework="pt") as handle:
        assert "layers.0.self_attn.q_proj.bias" in handle.keys()
    prompts = _prompts(target, count=2, length=64)
    # fp32: in bf16 a 4-token verify pass and 1-token decode can round a near-tie apart.
    base = ["--model-path", str(target), "--mem-fraction-static", "0.4",
            "--max-total-tokens", "4096", "--dtype", "float32"]  # fmt: skip
    with running_server(base, tmp_path / "plain.log") as url:
        expected = [generate(url, p, 16)["output_ids"] for p in prompts]
    with running_server(base + _serve_flags(head, "full"), tmp_path / "spec.log") as url:
        results = [generate(url, p, 16) for p in prompts]
    for want, result in zip(expected, results, strict=True):
        assert result["output_ids"] == want
        assert result["meta_info"]["spec_verify_ct"] > 0
