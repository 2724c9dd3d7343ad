"""`train_eagle3`: chat prompts -> the target's answers and fused low/middle/high features
(cached) -> draft vocabulary D from the answers -> EAGLE-3 head trained with the
training-time test (checkpointed, resumable) -> SpecForge-layout directory SGLang serves
with ``--speculative-algorithm EAGLE3``."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from nanospec_server.train.eagle3_export import export_eagle3
from nanospec_server.train.eagle3_features import aux_layer_ids, capture_layers
from nanospec_server.train.eagle3_head import Eagle3Config, Eagle3Head
from nanospec_server.train.eagle3_loop import CHECKPOINT, Eagle3LoopConfig, train
from nanospec_server.train.eagle3_vocab import answer_token_counts, d2t_t2d, draft_vocabulary
from nanospec_server.train.head import HeadConfig
from nanospec_server.train.precision import use_bf16
from nanospec_server.train.run import TrainReport, TrainRequest, _feature_caches
from nanospec_server.train.target import (
    find_tensor,
    load_shared_weights,
    pick_device,
    read_config,
    resolve_target,
)


def _init_from_target(head: Eagle3Head, target_dir: Path, shared, draft_ids) -> None:
    """The LM head starts as (and unless trained stays) the target's rows of D, and the
    final norm as the target's: then a draft state equal to the target's next pre-norm
    state would give the target's own logits over D."""
    with torch.no_grad():
        head.lm_head.weight.copy_(shared.lm_head[draft_ids.to(shared.lm_head.device)].float())
        head.norm.weight.copy_(find_tensor(target_dir, ["model.norm.weight"]).float())


def train_eagle3(request: TrainRequest) -> TrainReport:
    recipe = request.recipe
    device = pick_device(request.device)
    torch.manual_seed(request.seed)
    target_dir = resolve_target(request.target)
    target_config = read_config(target_dir)
    capture = capture_layers(target_config["num_hidden_layers"], recipe.aux_layers)
    layer_config = HeadConfig.from_target(target_config)
    if recipe.intermediate_size:
        layer_config = replace(layer_config, intermediate_size=recipe.intermediate_size)

    started = time.monotonic()
    train_rows, val_rows = _feature_caches(
        request, target_dir, layer_config.hidden_size, device, tuple(capture)
    )
    generate_seconds = time.monotonic() - started

    bf16 = use_bf16(request.precision, device)
    shared = load_shared_weights(target_dir, torch.float32, device)
    vocab_size = shared.embed.shape[0]
    counts = answer_token_counts(train_rows, vocab_size)
    shared_head = recipe.draft_vocab_size == 0
    size = vocab_size if shared_head else recipe.draft_vocab_size
    draft_ids = draft_vocabulary(counts, size)
    head = Eagle3Head(Eagle3Config(layer_config, len(capture), size))
    generator = torch.Generator().manual_seed(request.seed)
    head.reset_parameters(generator)
    _init_from_target(head, target_dir, shared, draft_ids)
    # A shared head is the target's at serve time, so it cannot be trained here.
    head.lm_head.weight.requires_grad_(recipe.train_lm_head and not shared_head)
    head.to(device)

    loop_config = Eagle3LoopConfig(
        steps=recipe.steps,
        batch_rows=recipe.batch_rows,
        lr=recipe.lr,
        warmup_steps=min(recipe.warmup_steps, max(1, recipe.steps // 10)),
        unroll_steps=recipe.unroll_steps,
        cls_stride=recipe.cls_stride,
        eval_every=max(1, recipe.steps // 8),  # a curve of acceptance against tokens
        checkpoint_every=5,  # a step takes minutes on a loaded CPU: lose little to a kill
        bf16=bf16,
    )
    # The checkpoint belongs to this recipe, seed, target and data only.
    fingerprint = hashlib.sha256(
        json.dumps(
            [asdict(recipe), request.seed, str(target_dir), capture, len(train_rows.input_ids)],
            default=str,
        ).encode()  # fmt: skip
    ).hexdigest()
    request.output.mkdir(parents=True, exist_ok=True)
    result = train(head, train_rows, val_rows, shared.embed, draft_ids, loop_config, device,
                   generator, request.output / CHECKPOINT, fingerprint)  # fmt: skip

    answer_tokens = int(counts.sum())
    info = {
        "arch": "eagle3",
        "target": str(target_dir),
        "recipe": asdict(recipe),
        "seed": request.seed,
        "device": str(device),
        "bf16": bf16,
        "data": "target's greedy answers to chat prompts (nanospec_server/train/prompts.py)",
        "aux_layer_ids": aux_layer_ids(capture),
        "draft_vocab_size": size,
        "draft_vocab_answer_coverage": float(counts[draft_ids].sum()) / max(answer_tokens, 1),
        "train_rows": len(train_rows.input_ids),
        "train_answer_tokens": answer_tokens,
        "val_rows": len(val_rows.input_ids),
        "generate_seconds": round(generate_seconds, 1),
        "train_seconds": round(result.seconds, 1),
        "train_tokens_per_second": round(result.tokens_per_second, 1),
        "evals": result.evals,
    }
    (request.output / "train_loss.json").write_text(json.dumps(result.train_loss) + "\n")
    vocab = None if shared_head else d2t_t2d(draft_ids, vocab_size)
    export_eagle3(head, target_dir, target_config, request.output, aux_layer_ids(capture),
                  vocab, info)  # fmt: skip
    return TrainReport(request.output, generate_seconds, result)
