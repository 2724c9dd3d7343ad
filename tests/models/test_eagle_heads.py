"""EAGLE heads of the registry targets: the shipped one is complete, the large one is
trained on demand only when missing, `models list|prepare` show and name them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nanospec_server.models.eagle_heads import (
    HEADS,
    get_head_spec,
    head_dir,
    is_ready,
)
from nanospec_server.models_cli import main as models_main
from nanospec_server.train.on_demand import prepare_head


def test_committed_heads_are_complete_sglang_eagle_checkpoints() -> None:
    committed = [spec for spec in HEADS if spec.committed]
    assert committed
    for spec in committed:
        path = head_dir(spec)
        assert is_ready(path), path
        config = json.loads((path / "config.json").read_text())
        assert config["architectures"] == ["Qwen2ForCausalLMEagle"]
        assert config["num_hidden_layers"] == 1
        info = json.loads((path / "nanospec_head.json").read_text())
        assert info["recipe"]["steps"] > 0 and info["evals"][-1]["top1"] > 0.2
        assert sum(f.stat().st_size for f in path.iterdir()) < 50e6  # the repository's limit


def test_a_present_head_is_not_retrained(tmp_path: Path) -> None:
    spec = get_head_spec("qwen2.5-coder-1.5b-instruct-eagle")
    assert spec is not None and not spec.committed
    shipped = head_dir(get_head_spec("qwen2.5-coder-0.5b-instruct-eagle"))
    shutil.copytree(shipped, head_dir(spec, tmp_path))  # stands in for a finished training
    assert prepare_head(spec, tmp_path) == (head_dir(spec, tmp_path), True)


def test_list_shows_heads_and_prepare_names_them(capsys) -> None:
    assert models_main(["models", "list"]) == 0
    out = capsys.readouterr().out
    for spec in HEADS:
        assert spec.name in out
    assert "trained on demand" in out or all(is_ready(head_dir(s)) for s in HEADS)
    assert models_main(["models", "prepare", "no-such-model"]) == 2
    assert "qwen2.5-coder-1.5b-instruct-eagle" in capsys.readouterr().err


@pytest.mark.parametrize("spec", HEADS, ids=lambda spec: spec.name)
def test_heads_draft_for_registry_targets(spec) -> None:
    from nanospec_server.models.registry import get_model_spec

    assert get_model_spec(spec.target).name == spec.target
