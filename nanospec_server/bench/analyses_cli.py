"""`nanospec bench coverage` (Figure 1b, vocabulary evolution) and `nanospec bench latency`
(Table 4): the analyses that need no server."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from nanospec_server.arg_types import positive_int
from nanospec_server.bench.api import _model_dir
from nanospec_server.bench.configs import default_dtype, default_token_map_corpus, size_arg
from nanospec_server.bench.data import TASKS, DataError, load_specbench, load_tasks, specbench_path
from nanospec_server.bench.provenance import bench_root, command_line, provenance

W_SWEEP = [256, 512, 1024, 2048, 3072, 4096, 8192]
K_SWEEP = [512, 1024, 2048, 4096, 8192, 16384, 32768]


def add_analysis_commands(sub: argparse._SubParsersAction) -> None:
    cov = sub.add_parser("coverage", help="Figure 1b offline: coverage vs vocabulary size, "
                                          "static top-k vs NanoSpec, and |I| over a generation")  # fmt: skip
    cov.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="name or directory")
    cov.add_argument("--from-run", type=Path, help="take ar's greedy outputs from this run")
    cov.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    cov.add_argument("--limit-per-task", type=positive_int, default=2)
    cov.add_argument("--seed", type=int, default=0)
    cov.add_argument("--specbench", help="Spec-Bench question.jsonl")
    cov.add_argument(
        "--max-new-tokens", type=positive_int, default=128, help="when generating here"
    )
    cov.add_argument("--w-max", nargs="+", type=positive_int, default=W_SWEEP)
    cov.add_argument("--static-k", nargs="+", type=size_arg, default=K_SWEEP)
    cov.add_argument("--step-tokens", type=positive_int, default=3,
                     help="tokens emitted per replayed step (an acceptance length)")  # fmt: skip
    cov.add_argument(
        "--token-map-corpus", nargs="+", help="FR-Spec corpus (default: Python stdlib)"
    )
    cov.add_argument("--out", type=Path, default=bench_root() / "coverage", help="output directory")
    cov.add_argument("--tiny", action="store_true", help="the tiny offline target")
    cov.set_defaults(func=lambda args: coverage_command(args, cov))

    lat = sub.add_parser("latency", help="Table 4: a draft step's latency, part by part")
    lat.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct",
                     help="STANDALONE draft (name or directory), or with --eagle the target "
                          "whose embedding and LM head the head shares")  # fmt: skip
    lat.add_argument("--eagle", type=Path, help="time this EAGLE head's draft step instead")
    lat.add_argument("--w-max", type=positive_int, default=3072)
    lat.add_argument("--static-k", type=size_arg, default=32768)
    lat.add_argument("--steps", type=positive_int, default=30)
    lat.add_argument("--context", type=positive_int, default=512, help="KV-cache tokens")
    lat.add_argument("--specbench", help="Spec-Bench question.jsonl (the text of the stream)")
    lat.add_argument("--out", type=Path, default=bench_root() / "latency", help="output directory")
    lat.add_argument("--tiny", action="store_true", help="the tiny offline standalone draft")
    lat.set_defaults(func=lambda args: latency_command(args, lat))


def _load(name: str, tiny: bool):
    """A model in the dtype `nanospec serve` would run it in on this host."""
    # deferred: imports torch, transformers only when called
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = _model_dir(name, tiny)
    dtype = torch.float32 if tiny else getattr(torch, default_dtype())
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).eval()
    return path, model, AutoTokenizer.from_pretrained(str(path))


def coverage_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    # deferred: imports torch only when called
    import torch

    from nanospec_server.bench import coverage as cov
    from nanospec_server.vocab_tools.replay import Sequence, target_topk
    from nanospec_server.vocab_tools.token_map import corpus_texts, top_k_token_ids

    torch.set_num_threads(1)
    if args.from_run and not (args.from_run / "records.jsonl").is_file():
        parser.error(f"--from-run: {args.from_run} holds no records.jsonl")
    target = (
        "agree-target" if args.tiny and args.target == parser.get_default("target") else args.target
    )
    path, model, tokenizer = _load(target, args.tiny)
    if args.from_run:
        raw = cov.outputs_from_run(args.from_run)
    else:
        try:
            prompts = load_tasks(Path(args.specbench) if args.specbench else None,
                                 args.limit_per_task, args.seed, args.tasks)  # fmt: skip
        except DataError as error:
            parser.error(f"--specbench: {error}")
        raw = cov.generate_outputs(model, tokenizer, prompts, args.max_new_tokens)
    sequences = [Sequence(ids, out, target_topk(model, ids + out, 3), task)
                 for _, task, ids, out in raw if out]  # fmt: skip
    vocab_size = model.lm_head.weight.shape[0]
    corpus = [Path(p) for p in args.token_map_corpus or []] or default_token_map_corpus()
    ranked = top_k_token_ids(tokenizer, corpus_texts(corpus), max(args.static_k),
                             [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])  # fmt: skip
    eos = (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ()
    tables = cov.coverage_tables(sequences, vocab_size, args.w_max, args.static_k, ranked,
                                 args.step_tokens, eos)  # fmt: skip
    longest = max(sequences, key=lambda s: len(s.output))
    default_w = 3072 if 3072 in args.w_max else args.w_max[0]
    result = {"target": str(path), "step_tokens": args.step_tokens, "tables": tables,
              "sequences": [{"task": s.task, "prompt_len": len(s.prompt), "output_len": len(s.output)}
                            for s in sequences],
              "evolution": cov.evolution(longest, vocab_size, default_w, args.step_tokens, eos),
              "provenance": provenance({k: str(v) for k, v in vars(args).items() if k != "func"})}  # fmt: skip
    report = cov.write_outputs(args.out, result, default_w)
    print(report.read_text())
    return 0


def latency_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    # deferred: imports torch only when called
    import torch

    from nanospec_server.bench import latency

    torch.set_num_threads(1)
    draft = args.draft
    if args.tiny and draft == parser.get_default("draft"):
        draft = "tiny-target" if args.eagle else "tiny-standalone"
    path, model, tokenizer = _load(draft, args.tiny)
    fc = None
    if args.eagle:
        if not (args.eagle / "model.safetensors").is_file():
            parser.error(f"--eagle: {args.eagle} holds no model.safetensors")
        try:
            model, fc = latency.eagle_draft(args.eagle, model, model.lm_head.weight.dtype)
        except (ValueError, RuntimeError) as error:
            parser.error(f"--eagle: {error}")
        path = args.eagle
    try:
        prompts = load_specbench(specbench_path(Path(args.specbench) if args.specbench else None))
    except DataError as error:
        parser.error(f"--specbench: {error}")
    stream: list[int] = []
    needed = args.w_max + args.steps * 20 + args.context
    for p in prompts:
        stream += tokenizer(" ".join(p.turns), add_special_tokens=False)["input_ids"]
        if len(stream) >= needed:
            break
    try:
        result = latency.breakdown(
            model, stream, args.w_max, args.steps, args.context, args.static_k, fc
        )
    except ValueError as error:
        parser.error(f"--w-max/--steps: {error}")
    args.out.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) for k, v in vars(args).items() if k != "func"}
    (args.out / "latency.json").write_text(json.dumps(
        {"breakdown": result, "steps": latency.step_totals(result), "provenance": provenance(settings)}, indent=2))  # fmt: skip
    text = latency.markdown(result, command_line(), str(path))
    (args.out / "latency.md").write_text(text)
    print(text)
    return 0
