"""`nanospec vocab`: coverage-latency trimming (`trim`), its corpus (`answers`), its
latency calibration (`calibrate`) and the hybrid prior's size by the same method (`prior-k`)."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from nanospec_server.arg_types import fraction, positive_int
from nanospec_server.vocab_tools.answers import assistant_texts, self_distilled_answers
from nanospec_server.vocab_tools.trim import (
    DEFAULT_ALPHA,
    DraftShape,
    LatencyModel,
    TreeShape,
    TrimProblem,
    backbone_flops,
    calibrate,
    count_tokens,
    coverage_curve,
    exhaustive_best,
    head_flops,
    held_out_coverage,
    trim,
)


def _add_search_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--min-coverage", type=fraction, required=True,
                        help="constraint: the chosen size covers at least this share")  # fmt: skip
    parser.add_argument("--alpha", type=fraction, default=DEFAULT_ALPHA,
                        help=f"coverage weight in the utility (default {DEFAULT_ALPHA}, the paper's)")  # fmt: skip
    parser.add_argument("--trials", type=positive_int, default=60, help="TPE trials (default 60)")
    parser.add_argument("--seed", type=int, default=0, help="TPE seed (default 0)")


def add_vocab_commands(commands: argparse._SubParsersAction) -> None:
    vocab = commands.add_parser("vocab", help="choose draft vocabularies: trimming, prior size")
    sub = vocab.add_subparsers(dest="vocab_command", required=True)

    trim_parser = sub.add_parser("trim", help="coverage-latency trimming (TPE): a static token map",
                          description=__doc__)  # fmt: skip
    trim_parser.add_argument(
        "--tokenizer", type=Path, required=True, help="target model/tokenizer dir"
    )
    trim_parser.add_argument("--draft-config", type=Path, required=True,
                      help="the draft's config.json (or its directory): an EAGLE head or a model")  # fmt: skip
    trim_parser.add_argument("--answers", type=Path, nargs="+", required=True,
                      help="assistant responses: JSONL (answer / conversations / messages / "
                           "text) or text files; not a benchmark")  # fmt: skip
    _add_search_flags(trim_parser)
    trim_parser.add_argument("--steps", type=positive_int, default=4, help="draft steps per round")
    trim_parser.add_argument(
        "--topk", type=positive_int, default=1, help="draft tree branches per step"
    )
    trim_parser.add_argument(
        "--context", type=positive_int, default=512, help="KV context for attention"
    )
    trim_parser.add_argument("--calibration", type=Path,
                      help="latency model from `nanospec vocab calibrate` (default: FLOPs alone)")  # fmt: skip
    trim_parser.add_argument("--folds", type=positive_int, default=1,
                      help="coverage held out: ranked on the other folds of the answers, counted "
                           "on each (default 1: in-sample, the paper's)")  # fmt: skip
    trim_parser.add_argument("--output", type=Path, required=True, help="token map to write (.pt)")
    trim_parser.set_defaults(func=lambda args: trim_command(args, trim_parser))

    answers = sub.add_parser("answers", help="self-distilled answers: the target answers the "
                                             "trainer's training prompts (a trimming corpus)")  # fmt: skip
    answers.add_argument("--target", required=True, help="registry name or model directory")
    answers.add_argument("--prompts", type=positive_int, default=48)
    answers.add_argument("--max-new-tokens", type=positive_int, default=128)
    answers.add_argument("--seed", type=int, default=0)
    answers.add_argument("--output", type=Path, required=True, help="JSONL to write")
    answers.set_defaults(func=lambda args: answers_command(args, answers))

    cal = sub.add_parser(
        "calibrate", help="fit ms = a + b * FLOPs to `nanospec bench latency` runs"
    )
    cal.add_argument("--latency", type=Path, nargs="+", required=True, help="latency.json files")
    cal.add_argument("--draft-config", type=Path, required=True, help="the timed draft's config")
    cal.add_argument("--output", type=Path, required=True, help="calibration JSON to write")
    cal.set_defaults(func=lambda args: calibrate_command(args, cal))

    prior = sub.add_parser("prior-k", help="the hybrid prior's k by the same utility and TPE, "
                                           "coverage replayed through the serving window")  # fmt: skip
    prior.add_argument("--target", required=True, help="registry name or model directory")
    prior.add_argument("--answers", type=Path, required=True,
                       help="JSONL from `nanospec vocab answers` (prompt_ids, answer_ids)")  # fmt: skip
    prior.add_argument("--latency", type=Path, required=True,
                       help="latency.json of the draft (`nanospec bench latency`): its backbone ms")  # fmt: skip
    _add_search_flags(prior)
    prior.add_argument("--max-k", type=positive_int, default=32768)
    prior.add_argument("--w-max", type=positive_int, default=3072)
    prior.add_argument("--step-tokens", type=positive_int, default=3,
                       help="tokens emitted per replayed step (an acceptance length)")  # fmt: skip
    prior.add_argument("--compare", type=int, nargs="*", default=[0, 512, 2048, 8192],
                       help="sizes always evaluated and reported (default: the hand-picked ones)")  # fmt: skip
    prior.add_argument("--output", type=Path, required=True, help="result JSON to write")
    prior.set_defaults(func=lambda args: prior_command(args, prior))


def _config_path(path: Path) -> Path:
    return path / "config.json" if path.is_dir() else path


def trim_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    # deferred: imports torch, transformers only when called
    import torch
    from transformers import AutoTokenizer

    missing = [str(p) for p in args.answers if not p.is_file()]
    if missing:
        parser.error(f"--answers: no such file: {', '.join(missing)}")
    config_path = _config_path(args.draft_config)
    if not config_path.is_file():
        parser.error(f"--draft-config: no such file: {config_path}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(args.tokenizer))
    except OSError as error:
        parser.error(f"--tokenizer: {error}")
    latency = LatencyModel()
    if args.calibration:
        if not args.calibration.is_file():
            parser.error(f"--calibration: no such file: {args.calibration}")
        latency = LatencyModel(**json.loads(args.calibration.read_text())["model"])
    shape = DraftShape.from_config(json.loads(config_path.read_text()))
    always = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    try:
        per_answer = [count_tokens(tokenizer, [a]) for a in assistant_texts(args.answers)]
        counts = sum(per_answer, Counter())
        curve = coverage_curve(counts, always)
        if args.folds > 1:
            curve = held_out_coverage(per_answer, args.folds, always, shape.vocab_size)
    except ValueError as error:
        parser.error(f"--answers: {error}")
    problem = TrimProblem(curve, shape, TreeShape(args.steps, args.topk), args.context,
                               latency, args.alpha, args.min_coverage)  # fmt: skip
    search = trim(problem, args.trials, args.seed)  # V covers all: a size always fits
    ids = list(curve.ranked[: search.best_k])
    if len(ids) < search.best_k:  # a size past the corpus vocabulary: fill with unseen ids
        seen = set(ids)
        ids += [t for t in range(shape.vocab_size) if t not in seen][: search.best_k - len(ids)]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ids, args.output)
    summary = {"best": problem.row(search.best_k), "full": problem.row(shape.vocab_size),
               "exhaustive_check_k": exhaustive_best(problem), "folds": args.folds,
               "answer_tokens": sum(counts.values()),
               "distinct_answer_tokens": len(counts), "alpha": args.alpha,
               "min_coverage": args.min_coverage, "tree": vars(problem.tree) | {},
               "latency_model": vars(latency), "trials": search.trials}  # fmt: skip
    summary_path = args.output.with_suffix(".json")
    summary_path.write_text(json.dumps(summary, indent=2, default=str))
    best = summary["best"]
    print(f"nanospec: k = {search.best_k}: coverage {best['coverage']:.4f}, draft latency saved "
          f"{best['latency_saved']:.1%}, utility {best['utility']:.4f} "
          f"(brute-force check: k = {summary['exhaustive_check_k']})")  # fmt: skip
    print(f"nanospec: wrote {len(ids)} token ids to {args.output} (search in {summary_path})")
    return 0


def answers_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    # deferred: imports torch only when called
    from nanospec_server.train.target import resolve_target

    try:
        model_dir = resolve_target(args.target)
    except (ValueError, KeyError) as error:
        parser.error(f"--target: {error}")
    records = self_distilled_answers(model_dir, args.prompts, args.max_new_tokens, args.seed)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"nanospec: wrote {len(records)} answers to {args.output}")
    return 0


def calibration_points(latency: dict, shape) -> list[tuple[str, float, float]]:
    """One-call parts of a `bench latency` breakdown as (label, GFLOPs, ms)."""
    b = latency["breakdown"]
    points = [("backbone", backbone_flops(shape, b["context"]) / 1e9, b["backbone"])]
    for key, rows in (("head_full", b["vocab_size"]), ("head_static", b["static_k"]),
                      ("head_packed", b["packed_rows_mean"])):  # fmt: skip
        points.append((f"{key} ({rows:.0f} rows)", head_flops(shape, rows) / 1e9, b[key]))
    return points


def calibrate_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    missing = [str(p) for p in args.latency if not p.is_file()]
    if missing:
        parser.error(f"--latency: no such file: {', '.join(missing)}")
    config_path = _config_path(args.draft_config)
    if not config_path.is_file():
        parser.error(f"--draft-config: no such file: {config_path}")
    runs = [json.loads(p.read_text()) for p in args.latency]
    shape = DraftShape.from_config(json.loads(config_path.read_text()),
                                   runs[0]["breakdown"]["vocab_size"])  # fmt: skip
    points = [p for run in runs for p in calibration_points(run, shape)]
    fit = calibrate(points)
    result = {"model": vars(fit.model), "r2": fit.r2, "max_relative_error": fit.max_relative_error,
              "points": fit.points, "sources": [str(p) for p in args.latency]}  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2))
    for p in fit.points:
        print(f"{p['what']:>28}: {p['gflops']:.4f} GFLOPs, {p['ms']:.3f} ms measured, "
              f"{p['predicted_ms']:.3f} predicted")  # fmt: skip
    print(f"nanospec: ms = {fit.model.ms_per_forward:.3f} + {fit.model.ms_per_gflop:.3f} x GFLOPs, "
          f"R^2 {fit.r2:.3f}, worst relative error {fit.max_relative_error:.1%}")  # fmt: skip
    return 0


def prior_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    # deferred: imports torch only when called
    import torch

    from nanospec_server.train.target import load_target, load_tokenizer, resolve_target
    from nanospec_server.vocab_tools.prior import ranked_tokens
    from nanospec_server.vocab_tools.prior_tune import HeadTimer, PriorProblem
    from nanospec_server.vocab_tools.replay import Sequence, target_topk

    for flag, path in (("--answers", args.answers), ("--latency", args.latency)):
        if not path.is_file():
            parser.error(f"{flag}: no such file: {path}")
    records = [json.loads(line) for line in args.answers.read_text().splitlines() if line.strip()]
    if not records or any("prompt_ids" not in r or "answer_ids" not in r for r in records):
        parser.error(
            "--answers: needs prompt_ids and answer_ids per line (`nanospec vocab answers`)"
        )
    timed = json.loads(args.latency.read_text())["breakdown"]
    backbone_ms, head_dtype = timed["backbone"], getattr(torch, timed["dtype"])
    torch.set_num_threads(1)
    model_dir = resolve_target(args.target)
    tokenizer = load_tokenizer(model_dir)
    model = load_target(model_dir, torch.device("cpu"), torch.float32)
    sequences = [Sequence(r["prompt_ids"], r["answer_ids"],
                          target_topk(model, r["prompt_ids"] + r["answer_ids"], 3))
                 for r in tqdm(records, desc="target top-3", unit="answer") if r["answer_ids"]]  # fmt: skip
    weight = model.lm_head.weight.detach()  # top-3 in fp32; the head timed as bench latency ran
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    problem = PriorProblem(sequences, ranked_tokens(tokenizer), eos, weight.shape[0], backbone_ms,
                           HeadTimer(weight.to(head_dtype)), args.w_max, args.step_tokens, args.alpha,
                           args.min_coverage)  # fmt: skip
    search = problem.search(args.max_k, args.trials, args.seed, [k for k in args.compare if k > 0])
    compared = [problem.evaluate(k) for k in args.compare]
    result = {"best_k": search.best_k,
              "best": problem.evaluate(search.best_k) if search.best_k is not None else None,
              "compared": compared, "backbone_ms": backbone_ms,
              "head_ms_by_rows": problem.head_ms.measured, "sequences": len(sequences),
              "settings": {k: str(v) for k, v in vars(args).items() if k != "func"},
              "trials": search.trials, "evaluated": sorted(problem.rows.values(), key=lambda r: r["k"])}  # fmt: skip
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2))
    for row in [*compared, result["best"]]:
        if row is not None:
            print(f"k {row['k']:>6}: coverage {row['coverage']:.4f}, rows {row['mean_rows']:.0f}, "
                  f"step {row['step_ms']:.3f} ms, utility {row['utility']:.4f}")  # fmt: skip
    print(f"nanospec: TPE-chosen prior k = {search.best_k} (written to {args.output})")
    return 0
