"""Target features of self-distilled chat rows, computed once and cached on disk.

Why a cache rather than streaming: the target's forward pass is by far the most
expensive part of training (a 0.5B target is ~20x the head's cost per token), and
training makes several passes over the data, so each token's features are computed
once. The cache is bounded: ``rows * seq_len * hidden * 2`` bytes (bf16) is checked
against ``max_bytes`` before anything runs (e.g. 400 rows of 320 tokens of a
896-wide target: 229 MB).

Layout of a cache directory: ``shard-00000.safetensors``... each holding the fields
of ``distill.DistilledRows`` (``input_ids`` [rows, seq_len] int32, ``hidden``
[rows, seq_len, hidden] bf16, the target's last hidden state after its final norm,
which is what SGLang hands an EAGLE draft; ``lengths``, ``prompt_lengths``), then
``manifest.json`` written last (its presence marks a complete cache). Shards already
written are kept, so an interrupted run resumes.
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

from nanospec_server.models.chat import encode_user_turns
from nanospec_server.train.distill import DistilledRows, generate_rows
from nanospec_server.train.prompts import Split, chat_prompts

CACHE_VERSION = 3
MANIFEST = "manifest.json"


class CacheTooLarge(ValueError):
    pass


@dataclass(frozen=True)
class FeatureCacheSpec:
    split: Split
    rows: int
    seq_len: int
    seed: int
    gen_batch: int  # rows answered together (one batched forward per token)
    dtype: str = "bfloat16"  # the target's while answering: its greedy answers depend on it
    rows_per_shard: int = 32
    # EAGLE-3: the decoder layers whose inputs are kept, fused (eagle3_features.py);
    # None: the final-normed state (EAGLE-1). Left out of the key when None, so the
    # EAGLE-1 caches written before it keep their names.
    aux_layers: tuple[int, ...] | None = None

    @property
    def shard_rows(self) -> int:
        """Rows per shard: at least one answering batch, or a shard would cap the batch."""
        return max(self.rows_per_shard, self.gen_batch)

    @property
    def max_prompt_tokens(self) -> int:
        """Longer prompts are skipped: at least half of every row is the target's answer."""
        return self.seq_len // 2


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
            "python": sys.version.split()[0],  # the prompts quote stdlib docstrings
            "spec": {k: v for k, v in asdict(spec).items() if k != "aux_layers" or v},
        },
        sort_keys=True,
        default=str,
    )
    name = f"{model_dir.parent.name}-{spec.split.value}"
    return root / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def check_size(rows: int, seq_len: int, hidden_size: int, max_bytes: int) -> int:
    needed = rows * seq_len * (hidden_size * 2 + 4)
    if needed > max_bytes:
        raise CacheTooLarge(
            f"feature cache would take {needed / 1e9:.2f} GB > limit {max_bytes / 1e9:.2f} GB; "
            "lower --tokens or raise --max-cache-gb"
        )
    return needed


def _prompt_ids(spec: FeatureCacheSpec, tokenizer) -> list[list[int]]:
    """``spec.rows`` encoded prompts that fit ``max_prompt_tokens``, in a fixed order."""
    texts = chat_prompts(spec.split, spec.rows * 2, spec.seed)
    encoded = [
        ids for ids in encode_user_turns(tokenizer, texts) if len(ids) <= spec.max_prompt_tokens
    ]
    if len(encoded) < spec.rows:
        raise ValueError(
            f"only {len(encoded)} prompts fit in {spec.max_prompt_tokens} tokens; raise --seq-len"
        )
    return encoded[: spec.rows]


def build_cache(
    cache_dir: Path, spec: FeatureCacheSpec, target, tokenizer, eos_ids: set[int],
    device: torch.device, desc: str,
) -> Path:  # fmt: skip
    """Answer ``spec``'s prompts with ``target`` into ``cache_dir`` unless already complete."""
    if (cache_dir / MANIFEST).is_file():
        return cache_dir
    cache_dir.mkdir(parents=True, exist_ok=True)
    prompts = _prompt_ids(spec, tokenizer)
    shards = []
    with tqdm(total=len(prompts), desc=desc, unit="row", smoothing=0.1) as bar:
        for index, start in enumerate(range(0, len(prompts), spec.shard_rows)):
            shard_path = cache_dir / f"shard-{index:05d}.safetensors"
            shard_prompts = prompts[start : start + spec.shard_rows]
            if not shard_path.is_file():
                # Similar lengths batched together waste less padding.
                ordered = sorted(shard_prompts, key=len)
                parts = []
                for first in range(0, len(ordered), spec.gen_batch):
                    batch = ordered[first : first + spec.gen_batch]
                    parts.append(generate_rows(target, batch, spec.seq_len, eos_ids, device,
                                               spec.aux_layers))  # fmt: skip
                    bar.update(len(batch))
                tensors = {k: v.contiguous() for k, v in vars(DistilledRows.cat(parts)).items()}
                tmp = shard_path.with_suffix(".tmp")
                save_file(tensors, str(tmp))
                tmp.rename(shard_path)
            else:
                bar.update(len(shard_prompts))
            shards.append(shard_path.name)
    manifest = {"version": CACHE_VERSION, "rows": len(prompts), "shards": shards,
                "spec": asdict(spec)}  # fmt: skip
    (cache_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    return cache_dir


def load_cache(cache_dir: Path) -> DistilledRows:
    """All rows of a complete cache (``input_ids`` as int64)."""
    manifest = json.loads((cache_dir / MANIFEST).read_text())
    parts = [load_file(str(cache_dir / name)) for name in manifest["shards"]]
    rows = DistilledRows.cat([DistilledRows(**part) for part in parts])
    rows.input_ids = rows.input_ids.long()
    return rows
