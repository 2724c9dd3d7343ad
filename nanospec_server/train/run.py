"""`train_eagle`: chat prompts -> the target's answers and features (cached) -> trained
head -> SGLang draft dir."""

from __future__ import annotations

import gc
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from nanospec_server.models.paths import cache_root
from nanospec_server.ops.packed_linear import pack_linear_layers
from nanospec_server.train.attention import use_grouped_sdpa
from nanospec_server.train.export import export_head
from nanospec_server.train.features import (
    FeatureCacheSpec,
    build_cache,
    cache_dir_for,
    check_size,
    load_cache,
)
from nanospec_server.train.head import EagleHead, HeadConfig, init_from_last_layer, load_head
from nanospec_server.train.loop import LoopConfig, LoopResult, train
from nanospec_server.train.loss import LossWeights
from nanospec_server.train.precision import use_bf16
from nanospec_server.train.prompts import Split
from nanospec_server.train.recipe import Recipe
from nanospec_server.train.target import (
    eagle_architecture,
    load_shared_weights,
    load_target,
    load_tokenizer,
    pick_device,
    read_config,
    resolve_target,
)


@dataclass(frozen=True)
class TrainRequest:
    target: str  # checkpoint directory or registry name
    output: Path
    recipe: Recipe
    seed: int = 0
    device: str = "auto"
    cache_dir: Path | None = None  # default: <nanospec cache>/train-features
    max_cache_gb: float = 4.0
    include_embedding: bool = False
    precision: str = "auto"  # auto | bf16 | fp32, see precision.py


@dataclass
class TrainReport:
    output: Path
    generate_seconds: float
    loop: LoopResult


def _eos_ids(target_dir: Path, tokenizer) -> set[int]:
    """Every id that ends an answer: config, generation config and tokenizer agree or add up."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        path = target_dir / name
        value = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
        ids.update(value if isinstance(value, list) else [value] if value is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def answer_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto``: bf16 on CUDA, fp32 on a CPU (faster there, see recipe.py)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def _feature_caches(
    request: TrainRequest, target_dir: Path, hidden_size: int, device,
    aux_layers: tuple[int, ...] | None = None,
) -> tuple:  # fmt: skip
    """The train and validation rows, answered now unless cached. ``aux_layers`` (EAGLE-3):
    keep the fused inputs of these decoder layers instead of the final state."""
    recipe = request.recipe
    root = request.cache_dir or cache_root() / "train-features"
    dtype = answer_dtype(recipe.answer_dtype, device)
    specs = {
        split: FeatureCacheSpec(split, max(1, tokens // recipe.seq_len), recipe.seq_len,
                                request.seed, gen_batch=recipe.gen_batch,
                                dtype=str(dtype).removeprefix("torch."),
                                aux_layers=aux_layers)
        for split, tokens in ((Split.TRAIN, recipe.tokens), (Split.VAL, recipe.val_tokens))
    }  # fmt: skip
    rows = sum(spec.rows for spec in specs.values())
    width = hidden_size * (len(aux_layers) if aux_layers else 1)
    check_size(rows, recipe.seq_len, width, int(request.max_cache_gb * 1e9))
    dirs = {split: cache_dir_for(root, target_dir, spec) for split, spec in specs.items()}
    if not all((d / "manifest.json").is_file() for d in dirs.values()):
        target = load_target(target_dir, device, dtype)
        use_grouped_sdpa(target)  # batched answering without K/V copies (attention.py)
        pack_linear_layers(target)  # fp32 CPU matmuls without per-call repacking
        tokenizer = load_tokenizer(target_dir)
        eos_ids = _eos_ids(target_dir, tokenizer)
        for split in (Split.VAL, Split.TRAIN):  # validation first: a quick sanity check
            build_cache(dirs[split], specs[split], target, tokenizer, eos_ids, device,
                        f"answers/{split.value}")  # fmt: skip
        del target  # free its memory before training
        gc.collect()
    return load_cache(dirs[Split.TRAIN]), load_cache(dirs[Split.VAL])


def train_eagle(request: TrainRequest) -> TrainReport:
    device = pick_device(request.device)
    torch.manual_seed(request.seed)
    target_dir = resolve_target(request.target)
    target_config = read_config(target_dir)
    eagle_architecture(target_config)  # fail before the slow part on unsupported targets
    head_config = HeadConfig.from_target(target_config)
    if request.recipe.intermediate_size:
        head_config = replace(head_config, intermediate_size=request.recipe.intermediate_size)

    started = time.monotonic()
    train_rows, val_rows = _feature_caches(request, target_dir, head_config.hidden_size, device)
    generate_seconds = time.monotonic() - started

    bf16 = use_bf16(request.precision, device)
    shared_dtype = torch.bfloat16 if bf16 else torch.float32
    shared = load_shared_weights(target_dir, shared_dtype, device)
    generator = torch.Generator().manual_seed(request.seed)
    head = EagleHead(head_config)
    head.reset_parameters(generator)
    if request.recipe.init_from_target:
        init_from_last_layer(head, target_dir, target_config["num_hidden_layers"] - 1)
    if request.recipe.init_head:
        load_head(head, Path(request.recipe.init_head))
    head.to(device)
    recipe = request.recipe
    loop_config = LoopConfig(
        steps=recipe.steps,
        batch_rows=recipe.batch_rows,
        lr=recipe.lr,
        warmup_steps=min(recipe.warmup_steps, max(1, recipe.steps // 10)),
        eval_every=max(0, recipe.steps // 4),
        loss=LossWeights(classification=recipe.cls_weight, cls_stride=recipe.cls_stride),
        bf16=bf16,
        unroll_steps=recipe.unroll_steps,
    )
    result = train(head, train_rows, val_rows, shared, loop_config, device, generator)

    info = {
        "target": str(target_dir),
        "recipe": asdict(recipe),
        "seed": request.seed,
        "device": str(device),
        "bf16": bf16,
        "data": "target's greedy answers to chat prompts (nanospec_server/train/prompts.py)",
        "train_rows": len(train_rows.input_ids),
        "train_answer_tokens": int((train_rows.lengths - train_rows.prompt_lengths).sum()),
        "val_rows": len(val_rows.input_ids),
        "generate_seconds": round(generate_seconds, 1),
        "train_seconds": round(result.seconds, 1),
        "train_tokens_per_second": round(result.tokens_per_second, 1),
        "first_loss": result.train_loss[0],
        "last_loss": result.train_loss[-1],
        "evals": result.evals,
    }
    embed = shared.embed if request.include_embedding else None
    request.output.mkdir(parents=True, exist_ok=True)
    (request.output / "train_loss.json").write_text(json.dumps(result.train_loss) + "\n")
    export_head(head, target_dir, target_config, request.output, info, embed)
    return TrainReport(request.output, generate_seconds, result)
