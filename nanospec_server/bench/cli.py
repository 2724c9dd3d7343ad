"""`nanospec bench`: run, report, and the offline analyses.

nanospec bench run --quick                       # real pair: ar, full, nanospec; 5 short tasks
nanospec bench run --cpu-report                  # docs/results.md's report (~50 min on 2 cores)
nanospec bench run --tiny --quick                # tiny offline models (a minute)
nanospec bench run --analysis vocab-sweep        # Figure 1a: static top-k 32k..512
nanospec bench run --analysis wmax               # Figure 6: W_max 256..8192
nanospec bench run --analysis prior              # hybrid vocabulary: prior k 0..8192
nanospec bench run --analysis adaptive           # ar, nanospec, nanospec-adaptive; c 1..16
nanospec bench report RUN_DIR                    # rewrite report.md and the figures
nanospec bench coverage                          # Figure 1b offline, + evolution
nanospec bench latency                           # Table 4: per-step draft breakdown
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from nanospec_server import host
from nanospec_server.arg_types import non_negative_int, positive_int
from nanospec_server.bench.analyses_cli import add_analysis_commands
from nanospec_server.bench.api import ANALYSES, BenchSettings, run_bench
from nanospec_server.bench.configs import MODES, default_dtype, size_arg
from nanospec_server.bench.data import TASKS, DataError
from nanospec_server.bench.report import write_report
from nanospec_server.bench.store import RunMismatch
from nanospec_server.models.eagle_heads import get_head_spec, head_dir

# Three configurations (ar, full, nanospec), the five tasks with short prompts: summarization
# and RAG prompts run to ~750 tokens, one to two minutes of prefill each for a CPU's 1.5B target.
QUICK = {"limit_per_task": 1, "max_new_tokens": 32, "modes": ["full", "nanospec"],
         "concurrency": [1], "repeats": 1,
         "tasks": ["conversation", "translation", "qa", "math", "code"]}  # fmt: skip
# A CPU host like CI's (24 GB) holds one float32 1.5B + 0.5B server: one server at a time,
# a small KV pool (docs/results.md has its time on the idle 2-core host).
QUICK_CPU = {"max_servers": 1, "max_total_tokens": 4096}
# The documented CPU report (docs/results.md, ~50 minutes on the idle 2-core host): the 0.5B
# target with the shipped EAGLE head, whose LM head is most of a draft step; every mode, FR-Spec
# from 32k down to 512 (Figure 1a) and the hybrid prior; one prompt of each of the seven tasks
# drawn with seed 1, which no setting was tuned on; concurrency 1 and 8; one server at a time.
CPU_REPORT = {"target": "qwen2.5-coder-0.5b-instruct", "standalone": [], "shapes": [(4, 4, 8)],
              "static_ks": [32768, 8192, 2048, 512], "prior_ks": [0, 2048], "seed": 1,
              "limit_per_task": 1, "max_new_tokens": 48, "concurrency": [1, 8],
              "max_servers": 1, "max_total_tokens": 8192}  # fmt: skip
TINY = {"target": "agree-target", "eagle": ["agree-eagle"], "standalone": [],
        "dtype": "float32", "static_ks": [256], "max_total_tokens": 8192}  # fmt: skip


def _shape(text: str) -> tuple[int, int, int]:
    try:
        shape = tuple(int(p) for p in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"expected STEPS,TOPK,TOKENS (each >= 1), got {text!r}")
    return shape


def add_bench_command(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser("bench", help="benchmark configurations side by side, analyses",
                                description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = bench.add_subparsers(dest="bench_command", required=True)
    run = sub.add_parser("run", help="every configuration side by side on Spec-Bench + HumanEval")
    run.add_argument("--analysis", choices=list(ANALYSES), default="main",
                     help="configuration preset: main (every mode), vocab-sweep (Fig 1a), "
                          "wmax (Fig 6), ablation (Table 5), prior (hybrid vocabulary), "
                          "adaptive (ar, nanospec and nanospec-adaptive at concurrency "
                          "1 4 8 16)")  # fmt: skip
    run.add_argument("--target", help="target model: registry name or directory")
    run.add_argument("--standalone", nargs="*", help="STANDALONE draft models (names or dirs)")
    run.add_argument("--eagle", nargs="*", help="EAGLE head directories")
    run.add_argument("--eagle3", nargs="*",
                     help="EAGLE-3 head directories or tiny names (--speculative-algorithm "
                          "EAGLE3; static: the head's own d2t)")  # fmt: skip
    run.add_argument("--shape", nargs="+", type=_shape,
                     help="draft tree STEPS,TOPK,TOKENS, one or more (default 4,1,5)")  # fmt: skip
    run.add_argument(
        "--modes", nargs="+", choices=MODES, help="draft modes (default: the preset's)"
    )
    run.add_argument("--static-k", nargs="+", type=size_arg, help="FR-Spec sizes (default 32k)")
    run.add_argument("--w-max", nargs="+", type=positive_int, help="NanoSpec W_max values")
    run.add_argument("--prior-k", nargs="+", type=non_negative_int,
                     help="hybrid vocabulary: NanoSpec once per static prior size "
                          "(--nanospec-prior-k; 0 = the paper's window only; default 0)")  # fmt: skip
    run.add_argument("--adaptive", action="store_true", default=None,
                     help="also run each nanospec configuration with --nanospec-adaptive "
                          "(adaptive speculation), named ...-nanospec-adaptive")  # fmt: skip
    run.add_argument("--tasks", nargs="+", choices=TASKS, help="tasks (default: all seven)")
    run.add_argument("--specbench", help="Spec-Bench question.jsonl (default: ../shared/data/...)")
    run.add_argument("--limit-per-task", type=positive_int, help="prompts per task (default 2)")
    run.add_argument("--seed", type=int, help="prompt draw (default 0)")
    run.add_argument("--repeats", type=positive_int, help="passes over the prompts (default 1)")
    run.add_argument("--concurrency", nargs="+", type=positive_int, help="e.g. 1 8 (default 1)")
    run.add_argument("--max-new-tokens", type=positive_int, help="default 64 on CPU, 1024 on GPU")
    run.add_argument(
        "--dtype",
        help="server --dtype (default: what nanospec serve picks: "
        "float32 on a CPU without native bf16, else bfloat16)",
    )
    run.add_argument("--max-servers", type=positive_int,
                     help="servers up at once (groups keep ar and the full-vocab drafts in each; "
                          "with 2, ar alone, and ratios to full go through ar; with 1, one "
                          "server at a time, for an idle host only)")  # fmt: skip
    run.add_argument("--max-total-tokens", type=positive_int, help="each server's KV pool")
    run.add_argument(
        "--token-map-corpus", nargs="+", help="FR-Spec corpus (default: Python stdlib)"
    )
    run.add_argument("--tpe-token-map", type=Path,
                     help="a token map from `nanospec vocab trim`: adds <draft>-static-tpe "
                          "beside the FR-Spec sizes (static mode)")  # fmt: skip
    run.add_argument("--out", type=Path, help="run directory (default: derived from the settings; "
                                              "rerunning the same command resumes it)")  # fmt: skip
    run.add_argument("--tiny", action="store_true", help="tiny offline models (fp32)")
    presets = run.add_mutually_exclusive_group()
    presets.add_argument(
        "--cpu-report",
        action="store_true",
        help="the documented CPU report (docs/results.md): 0.5B target and the shipped EAGLE "
        "head, every mode, static 32k..512, prior 0 and 2048, 1 prompt per task (seed 1), "
        "48 new tokens, concurrency 1 and 8, one server at a time (~50 min on 2 cores)",
    )
    presets.add_argument(
        "--quick",
        action="store_true",
        help="1 prompt of each short task (not summarization, RAG), 32 new tokens, full and "
        "nanospec, concurrency 1; on a CPU one server at a time, a 4096-token KV pool",
    )
    run.set_defaults(func=lambda args: run_command(args, run))

    report = sub.add_parser("report", help="rewrite a run's report.md, summary.json and figures")
    report.add_argument("run_dir", type=Path)
    report.set_defaults(func=lambda args: report_command(args, report))
    add_analysis_commands(sub)


def shipped_eagle_head() -> Path:
    return head_dir(get_head_spec("qwen2.5-coder-0.5b-instruct-eagle"))


def settings_from(args: argparse.Namespace, parser: argparse.ArgumentParser):
    on_gpu = host.has_cuda()
    values: dict = {"max_new_tokens": 1024 if on_gpu else 64, "dtype": default_dtype()}
    values |= ANALYSES[args.analysis]
    if args.cpu_report:
        if args.analysis != "main" or args.tiny:
            parser.error("--cpu-report: runs the main analysis on the real models only")
        values |= CPU_REPORT | {"eagle": [str(shipped_eagle_head())]}
    if args.tiny:
        values |= TINY
    if args.quick:
        quick = dict(QUICK)
        if args.analysis != "main":
            quick.pop("modes")
        values |= quick
        if not on_gpu and not args.tiny:
            values |= QUICK_CPU
    given = {"target": args.target, "standalone": args.standalone, "eagle": args.eagle,
             "eagle3": args.eagle3,
             "shapes": args.shape, "modes": args.modes, "static_ks": args.static_k,
             "w_maxes": args.w_max, "prior_ks": args.prior_k, "tasks": args.tasks, "specbench": args.specbench,
             "limit_per_task": args.limit_per_task, "seed": args.seed, "repeats": args.repeats,
             "concurrency": args.concurrency, "max_new_tokens": args.max_new_tokens,
             "dtype": args.dtype, "max_servers": args.max_servers,
             "max_total_tokens": args.max_total_tokens, "token_map_corpus": args.token_map_corpus,
             "tpe_token_map": str(args.tpe_token_map.resolve()) if args.tpe_token_map else None,
             "adaptive": args.adaptive}  # fmt: skip
    values |= {k: v for k, v in given.items() if v is not None}
    if args.tiny:
        values["tiny"] = True
    settings = BenchSettings(**values)
    if args.tpe_token_map and not args.tpe_token_map.is_file():
        parser.error(f"--tpe-token-map: no such file: {args.tpe_token_map}")
    if args.tpe_token_map and "static" not in settings.modes:
        parser.error("--tpe-token-map: needs the static mode among --modes")
    if not settings.standalone and not settings.eagle and not settings.eagle3:
        parser.error("--standalone/--eagle/--eagle3: give at least one draft")
    if settings.adaptive and "nanospec" not in settings.modes:
        parser.error(
            "--adaptive: runs the nanospec configurations adaptively; add nanospec to --modes"
        )
    return settings


def run_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    settings = settings_from(args, parser)
    try:
        run_dir = run_bench(settings, args.out)
    except DataError as error:
        parser.error(f"--specbench: {error}")
    except RunMismatch as error:
        parser.error(f"--out: {error}")
    except ValueError as error:
        if "max_servers" in str(error):
            parser.error(f"--max-servers: {error}")
        raise
    print((run_dir / "report.md").read_text())
    print(f"nanospec: results in {run_dir}")
    bugs = json.loads((run_dir / "summary.json").read_text())["lossless"]["bugs"]
    if bugs:
        print(f"nanospec: error: {bugs} output(s) differ from plain decoding where speculation "
              "is bit-identical: a bug (see the report's lossless check)", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def report_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if not (args.run_dir / "run.json").is_file():
        parser.error(f"run_dir: {args.run_dir} holds no run (no run.json)")
    print(write_report(args.run_dir).read_text())
    return 0
