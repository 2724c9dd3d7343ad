"""`nanospec train-eagle`: argparse wiring for ``run.train_eagle``."""

from __future__ import annotations

import argparse
from pathlib import Path

from nanospec_server.arg_types import positive_float, positive_int
from nanospec_server.train.eagle3_run import train_eagle3
from nanospec_server.train.precision import CHOICES
from nanospec_server.train.recipe import RECIPES, recipe_for
from nanospec_server.train.run import TrainRequest, train_eagle


def _seq_len(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be at least 2 (one input, one target), got {value}")
    return value


def recipe_key(target: str) -> str:
    """A registry name for ``target``: itself, or the model folder of a prepared ``.../<name>/hf``."""
    path = Path(target)
    for candidate in (target, path.name, path.parent.name):
        if candidate in RECIPES:
            return candidate
    return target


def _aux_layers(text: str) -> tuple[int, ...]:
    try:
        layers = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated layer ids, got {text!r}"
        ) from None
    if len(set(layers)) != len(layers):
        raise argparse.ArgumentTypeError(f"layer ids repeat in {text!r}")
    return layers


def _vocab_size(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (the target's LM head) or more, got {value}")
    return value


def _device(text: str) -> str:
    if text in ("auto", "cpu") or text.startswith("cuda"):
        return text
    raise argparse.ArgumentTypeError(f"expected auto, cpu or cuda[:N], got {text!r}")


def add_train_command(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train-eagle",
        help="train an EAGLE-1 (full vocabulary) or EAGLE-3 draft head for a target model",
        description=(
            "Let the target answer chat prompts composed offline, keep its hidden states "
            "(cached), train one EAGLE decoder layer on them and write a directory that "
            "`nanospec serve --speculative-algorithm EAGLE --speculative-draft-model-path` "
            f"loads. Recipes with tuned defaults: {', '.join(sorted(RECIPES))}."
        ),
    )
    add = parser.add_argument
    add("--target", required=True, help="target checkpoint directory or registry model name")
    add("--output", type=Path, required=True, help="directory to write the draft head to")
    add("--tokens", type=positive_int, help="training tokens (default: the recipe's)")
    add("--val-tokens", type=positive_int, help="validation tokens (default: the recipe's)")
    add("--seq-len", type=_seq_len, help="tokens per training row (default: the recipe's)")
    add("--steps", type=positive_int, help="optimizer steps (default: the recipe's)")
    add("--batch-rows", type=positive_int, help="rows per step (default: the recipe's)")
    add("--lr", type=positive_float, help="peak learning rate (default: the recipe's)")
    add("--cls-stride", type=positive_int, help="LM-head loss on every N-th position")
    add("--cls-weight", type=positive_float, help="weight of the LM-head loss (regression: 1)")
    add("--unroll-steps", type=positive_int,
        help="training-time test: draft this many steps from every position (default: 1)")  # fmt: skip
    add("--intermediate-size", type=positive_int,
        help="the head's MLP width (default: the target's); narrower heads are smaller")  # fmt: skip
    add("--init-from-target", action="store_true", default=None,
        help="start the head's decoder layer from the target's last one")  # fmt: skip
    add("--init-head", help="continue training the head in this directory (e.g. a shipped one)")
    add("--gen-batch", type=positive_int, help="prompts answered together (default: the recipe's)")
    add(
        "--seed",
        type=int,
        default=0,
        help="prompt composition, data order and init seed (default: 0)",
    )
    add("--device", type=_device, default="auto", help="auto (CUDA if present), cpu or cuda[:N]")
    add(
        "--cache-dir",
        type=Path,
        help="feature cache root (default: <nanospec cache>/train-features)",
    )
    add("--max-cache-gb", type=positive_float, default=4.0, help="refuse larger feature caches")
    add("--precision", choices=CHOICES, default="auto",
        help="bf16 autocast or fp32 (auto: bf16 on CUDA and on CPUs with native bf16)")  # fmt: skip
    add("--include-embedding", action="store_true",
        help="also store the embedding table (SGLang replaces it with the target's anyway)")  # fmt: skip
    add("--arch", choices=("eagle1", "eagle3"), default="eagle1",
        help="eagle1: one layer over the final state, for --speculative-algorithm EAGLE; "
             "eagle3: fused low/middle/high states, its own draft vocabulary, SpecForge's "
             "layout, for --speculative-algorithm EAGLE3")  # fmt: skip
    add("--draft-vocab-size", type=_vocab_size,
        help="eagle3: tokens in the draft vocabulary D (most frequent in the answers; "
             "0: draft over every token through the target's own LM head, not stored)")  # fmt: skip
    add("--aux-layers", type=_aux_layers,
        help="eagle3: target layer ids to fuse, e.g. 1,11,20 (SGLang captures the input of "
             "id + 1; default: SGLang's [2, L/2, L-3] inputs)")  # fmt: skip
    add("--train-lm-head", action="store_true", default=None,
        help="eagle3: train the head's LM-head rows (default: keep the target's rows of D)")  # fmt: skip
    parser.set_defaults(func=run_train_command)
    return parser


def run_train_command(args: argparse.Namespace) -> int:
    eagle3_only = {"--draft-vocab-size": args.draft_vocab_size, "--aux-layers": args.aux_layers,
                   "--train-lm-head": args.train_lm_head}  # fmt: skip
    if args.arch != "eagle3":
        for flag, value in eagle3_only.items():
            if value is not None:
                raise SystemExit(f"nanospec train-eagle: {flag} needs --arch eagle3")
    recipe = recipe_for(
        recipe_key(args.target), arch=args.arch, draft_vocab_size=args.draft_vocab_size,
        aux_layers=args.aux_layers, train_lm_head=args.train_lm_head,
        tokens=args.tokens, val_tokens=args.val_tokens, seq_len=args.seq_len,
        steps=args.steps, batch_rows=args.batch_rows, lr=args.lr, cls_stride=args.cls_stride,
        cls_weight=args.cls_weight, unroll_steps=args.unroll_steps,
        intermediate_size=args.intermediate_size, init_from_target=args.init_from_target,
        gen_batch=args.gen_batch, init_head=args.init_head,
    )  # fmt: skip
    request = TrainRequest(
        target=args.target, output=args.output, recipe=recipe, seed=args.seed,
        device=args.device, cache_dir=args.cache_dir, max_cache_gb=args.max_cache_gb,
        include_embedding=args.include_embedding, precision=args.precision,
    )  # fmt: skip
    if args.arch == "eagle3":
        report = train_eagle3(request)
    else:
        report = train_eagle(request)
    last = report.loop.evals[-1]
    print(
        f"nanospec: wrote {report.output} (generate {report.generate_seconds:.0f} s, "
        f"train {report.loop.seconds:.0f} s, val top-1 {last['top1']:.3f})"
    )
    return 0
