"""Prepared models are served under their registry or tiny name, anything else as SGLang
names it (its path)."""

from pathlib import Path

from nanospec_server.models.paths import model_paths
from nanospec_server.models.served_name import served_name
from nanospec_server.models.tiny.build import tiny_cache_root


def test_prepared_models_are_named_by_their_registry_or_tiny_name(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NANOSPEC_CACHE", str(tmp_path))
    assert served_name(str(model_paths("qwen2.5-coder-0.5b-instruct").hf_dir)) == (
        "qwen2.5-coder-0.5b-instruct"
    )
    assert served_name(str(tiny_cache_root() / "tiny-eagle")) == "tiny-eagle"


def test_other_folders_keep_sglangs_name(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("NANOSPEC_CACHE", str(tmp_path / "cache"))
    assert served_name(str(tmp_path / "qwen2.5-coder-0.5b-instruct" / "hf")) is None
    assert served_name(str(model_paths("not-a-registry-model").hf_dir)) is None
    assert served_name(str(tmp_path / "tiny-eagle")) is None
    assert served_name(str(Path("relative/dir"))) is None
