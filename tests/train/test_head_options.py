"""Trainer options: answering dtype, a narrower head, a head started from the
target's last decoder layer."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from nanospec_server.models.tiny import tiny_model_path
from nanospec_server.train.export import export_head
from nanospec_server.train.features import FeatureCacheSpec, cache_dir_for
from nanospec_server.train.head import EagleHead, HeadConfig, init_from_last_layer, load_head
from nanospec_server.train.prompts import Split
from nanospec_server.train.run import answer_dtype
from nanospec_server.train.target import read_config


def test_answers_are_fp32_on_a_cpu_and_bf16_on_cuda() -> None:
    assert answer_dtype("auto", torch.device("cpu")) == torch.float32
    assert answer_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert answer_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16


def test_the_answering_dtype_is_part_of_the_cache_key(tmp_path: Path) -> None:
    model_dir = tiny_model_path("tiny-target")
    spec = FeatureCacheSpec(Split.TRAIN, rows=4, seq_len=64, seed=0, gen_batch=4)
    other = replace(spec, dtype="float32")
    assert cache_dir_for(tmp_path, model_dir, spec) != cache_dir_for(tmp_path, model_dir, other)


def test_a_shard_holds_at_least_one_answering_batch() -> None:
    spec = FeatureCacheSpec(Split.TRAIN, rows=256, seq_len=64, seed=0, gen_batch=16)
    assert spec.shard_rows == spec.rows_per_shard == 32
    assert replace(spec, gen_batch=128).shard_rows == 128


def test_a_narrow_head_exports_its_width(tmp_path: Path) -> None:
    target_dir = tiny_model_path("tiny-target")
    target_config = read_config(target_dir)
    cfg = replace(HeadConfig.from_target(target_config), intermediate_size=24)
    head = EagleHead(cfg)
    head.reset_parameters(torch.Generator().manual_seed(0))
    export_head(head, target_dir, target_config, tmp_path, info={})
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["intermediate_size"] == 24 != target_config["intermediate_size"]
    weights = load_file(str(tmp_path / "model.safetensors"))
    assert weights["layers.0.mlp.gate_proj.weight"].shape == (24, cfg.hidden_size)


def test_init_from_the_target_copies_its_last_layer() -> None:
    target_dir = tiny_model_path("tiny-target")
    target_config = read_config(target_dir)
    last = target_config["num_hidden_layers"] - 1
    narrow = replace(HeadConfig.from_target(target_config), intermediate_size=16)
    target = load_file(str(target_dir / "model.safetensors"))
    for cfg in (HeadConfig.from_target(target_config), narrow):
        head = EagleHead(cfg)
        head.reset_parameters(torch.Generator().manual_seed(0))
        init_from_last_layer(head, target_dir, last)
        for name, param in head.layers[0].named_parameters():
            source = target[f"model.layers.{last}.{name}"].float()
            expected = source[tuple(slice(0, n) for n in param.shape)]
            torch.testing.assert_close(param.data, expected, msg=name)


def test_a_head_continues_from_its_export(tmp_path: Path) -> None:
    target_dir = tiny_model_path("tiny-target")
    target_config = read_config(target_dir)
    cfg = HeadConfig.from_target(target_config)
    trained = EagleHead(cfg)
    trained.reset_parameters(torch.Generator().manual_seed(1))
    export_head(trained, target_dir, target_config, tmp_path, info={})
    head = EagleHead(cfg)
    load_head(head, tmp_path)
    for (name, a), b in zip(head.state_dict().items(), trained.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b.to(torch.bfloat16).float(), msg=name)
