"""Teacher-forced target features, computed once and cached on disk.

Why a cache rather than streaming: the target's forward pass is by far the most
expensive part of training (a 0.5B target is ~20x the head's cost per token), and
training makes several passes over the data, so each token's features are computed
once. The cache is bounded: ``num_tokens * hidden * 2`` bytes (bf16) is checked
against ``max_bytes`` before anything runs (e.g. 200k tokens of a 896-wide target:
358 MB).

Layout of a cache directory: ``shard-00000.safetensors``... each holding
``input_ids`` [rows, seq_len] int32 and ``hidden`` [rows, seq_len, hidden] bf16 (the
target's last hidden state after its final norm, which is what SGLang hands an
EAGLE draft), then ``manifest.json`` written last (its presence marks a complete
cache). Shards already written are kept, so an interrupted extraction resumes.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from nanospec_server.train.corpus import CorpusSpec, token_rows

CACHE_VERSION = 1
MANIFEST = "manifest.json"


class CacheTooLarge(ValueError):
    pass


@dataclass(frozen=True)
class FeatureCacheSpec:
    corpus: CorpusSpec
    rows_per_shard: int = 32
    batch_rows: int = 4


def _target_fingerprint(model_dir: Path) -> str:
    """Changes when the checkpoint does: config text plus weight file names and sizes."""
    digest = hashlib.sha256((model_dir / "config.json").read_bytes())
    for file in sorted(model_dir.glob("*.safetensors")):
        digest.update(f"{file.name}:{file.stat().st_size}".encode())
    return digest.hexdigest()[:16]


def cache_dir_for(root: Path, model_dir: Path, spec: FeatureCacheSpec) -> Path:
    key = json.dumps(
        {
            "version": CACHE_VERSION,
            "target": _target_fingerprint(model_dir),
            "python": sys.version.split()[0],  # the stdlib corpus depends on it
            "corpus": asdict(spec.corpus),
        },
        sort_keys=True,
    )
    name = f"{model_dir.parent.name}-{spec.corpus.split.value}"
    return root / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def check_size(num_tokens: int, hidden_size: int, max_bytes: int) -> int:
    needed = num_tokens * hidden_size * 2 + num_tokens * 4
    if needed > max_bytes:
        raise CacheTooLarge(
            f"feature cache would take {needed / 1e9:.2f} GB > limit {max_bytes / 1e9:.2f} GB; "
            "lower --tokens or raise --max-cache-gb"
        )
    return needed


@torch.inference_mode()
def _target_features(target, input_ids: torch.Tensor) -> torch.Tensor:
    # The base model (no LM head): its last_hidden_state is already final-normed.
    output = target.model(input_ids=input_ids, use_cache=False)
    return output.last_hidden_state.to(torch.bfloat16)


def build_cache(
    cache_dir: Path, spec: FeatureCacheSpec, target, encode, device: torch.device, desc: str
) -> Path:
    """Extract features for ``spec`` into ``cache_dir`` unless it is already complete."""
    if (cache_dir / MANIFEST).is_file():
        return cache_dir
    cache_dir.mkdir(parents=True, exist_ok=True)
    rows = torch.tensor(token_rows(spec.corpus, encode), dtype=torch.int32)
    shards = []
    with tqdm(total=rows.numel(), desc=desc, unit="tok", smoothing=0.1) as bar:
        for index, start in enumerate(range(0, len(rows), spec.rows_per_shard)):
            shard_path = cache_dir / f"shard-{index:05d}.safetensors"
            shard_rows = rows[start : start + spec.rows_per_shard]
            if not shard_path.is_file():
                hidden = []
                for batch in shard_rows.split(spec.batch_rows):
                    hidden.append(_target_features(target, batch.to(device, torch.long)).cpu())
                    bar.update(batch.numel())
                tmp = shard_path.with_suffix(".tmp")
                tensors = {"input_ids": shard_rows.contiguous(), "hidden": torch.cat(hidden)}
                save_file(tensors, str(tmp))
                tmp.rename(shard_path)
            else:
                bar.update(shard_rows.numel())
            shards.append(shard_path.name)
    manifest = {"version": CACHE_VERSION, "rows": len(rows), "shards": shards,
                "corpus": asdict(spec.corpus)}  # fmt: skip
    (cache_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    return cache_dir


def load_cache(cache_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """All rows of a complete cache: (input_ids int64 [N, L], hidden bf16 [N, L, d])."""
    manifest = json.loads((cache_dir / MANIFEST).read_text())
    parts = [load_file(str(cache_dir / name)) for name in manifest["shards"]]
    input_ids = torch.cat([p["input_ids"] for p in parts]).long()
    hidden = torch.cat([p["hidden"] for p in parts])
    return input_ids, hidden
