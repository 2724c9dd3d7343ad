"""`nanospec`: the command line of nanospec-server."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from pathlib import Path

from pydantic import ValidationError

from nanospec_server import engine_watch, env, host
from nanospec_server.adaptive.calibration import read_calibration
from nanospec_server.adaptive.registry import DEFAULT_POLICY, policy_names
from nanospec_server.admin.cli import add_admin_commands
from nanospec_server.bench.cli import add_bench_command
from nanospec_server.config import DEFAULT_HISTORY, Mode, NanoSpecConfig
from nanospec_server.models import defaults
from nanospec_server.models.errors import ModelPrepareError
from nanospec_server.models.served_name import served_name
from nanospec_server.models_cli import add_models_commands
from nanospec_server.sglang_plugin.entry import listening_here
from nanospec_server.train.cli import add_train_command
from nanospec_server.vocab_tools.token_map import build_token_map
from nanospec_server.vocab_tools.trim_cli import add_vocab_commands

UVICORN_STARTUP_FAILURE = 3  # uvicorn's exit code when it cannot start, e.g. bind the port


def _add_serve_command(commands: argparse._SubParsersAction) -> None:
    serve = commands.add_parser(
        "serve",
        help="start SGLang's HTTP server with the NanoSpec plugin",
        description=(
            "Start SGLang's HTTP server with the NanoSpec plugin. Every SGLang server flag "
            "(`python -m sglang.launch_server --help`) is accepted after ours. With no "
            "--model-path it serves the embedded default. On a host without CUDA the CPU "
            "flags and environment are added unless given."
        ),
    )
    serve.add_argument(
        "--tiny", action="store_true",
        help="with no --model-path: serve the tiny offline test models instead of the real default",
    )  # fmt: skip
    nanospec = serve.add_argument_group("NanoSpec")
    nanospec.add_argument(
        "--nanospec-mode", choices=[m.value for m in Mode], default=Mode.NANOSPEC.value,
        help="how the draft LM head is computed (default: nanospec)",
    )  # fmt: skip
    nanospec.add_argument("--nanospec-w-max", type=int, default=3072, help="window length W_max")
    nanospec.add_argument(
        "--nanospec-w-cap", type=int, default=None,
        help="window capacity fixed at start; the largest W_max a live change may set "
        "(default: W_max)",
    )  # fmt: skip
    nanospec.add_argument("--nanospec-k-pre", type=int, default=3, help="top-k per prompt position")
    nanospec.add_argument("--nanospec-k-ver", type=int, default=3, help="top-k per verify step")
    nanospec.add_argument(
        "--nanospec-stats-history", type=int, default=DEFAULT_HISTORY,
        help=f"finished requests /stats/vocab keeps per DP rank (default {DEFAULT_HISTORY})",
    )  # fmt: skip
    nanospec.add_argument(
        "--nanospec-union-capacity", type=int, default=None,
        help="rows of the packed draft LM head shared by running requests; a step whose "
        "union exceeds it drafts without the tokens left out (default: 8 x W_cap + EOS)",
    )  # fmt: skip
    nanospec.add_argument(
        "--nanospec-prior-k", type=int, default=None,
        help="hybrid vocabulary: also draft from the k most frequent tokens of a fixed "
        "non-benchmark corpus (default 0: the paper's window only; the embedded default "
        "pair on a CPU: 2048, measured fastest there)",
    )  # fmt: skip
    nanospec.add_argument(
        "--nanospec-adaptive", action=argparse.BooleanOptionalAction, default=None,
        help="adaptive speculation for every draft kind: each step drafts 0 to "
        "--speculative-num-steps tokens (a tree: all or none), whichever maximises the "
        "expected tokens per second under a cost model timed on this host, depth 0 being "
        "a plain decode step; switch it live with POST /nanospec/settings "
        "{\"adaptive\": false}. Default: on for a speculative server on a CPU (falling "
        "back to the fixed depth, with a log line, where it cannot run), off on CUDA; "
        "--no-nanospec-adaptive drafts the launch's depth every step",
    )  # fmt: skip
    nanospec.add_argument(
        "--nanospec-adaptive-keep-extend", action="store_true",
        help="with --nanospec-adaptive: run the draft extend on every depth-0 step too "
        "(an exact draft cache, at its cost per step). By default a depth-0 step skips "
        "it unless the next step drafts, so a run of depth-0 steps costs plain decodes: "
        "still lossless, the draft's cache then lacks that run's tokens but the last",
    )  # fmt: skip
    nanospec.add_argument(
        "--nanospec-adaptive-verify-depth-0", action="store_true",
        help="with --nanospec-adaptive: run depth-0 steps through SGLang's speculative "
        "verify path (TARGET_VERIFY) instead of its plain decode step (the reference "
        "benchmarks/depth0_cost.py measures the plain step against)",
    )  # fmt: skip
    nanospec.add_argument(
        "--nanospec-adaptive-policy", choices=policy_names(), default=None,
        help=f"with --nanospec-adaptive: the policy that chooses each step's depth "
        f"(default {DEFAULT_POLICY}: the goodput rule; fixed: the launch's depth every step "
        "unless pinned live)",
    )  # fmt: skip
    nanospec.add_argument(
        "--nanospec-adaptive-calibration", type=Path, default=None, metavar="PATH",
        help="with adaptive speculation: start the goodput policy's cost model from this "
        "file (an earlier server's /stats/vocab .adaptive.calibration on this host and "
        "configuration, or benchmarks/adaptive_probe.py --write-calibration) instead of "
        "timing the depths on its first requests; refused if recorded elsewhere",
    )  # fmt: skip


def _add_token_map_command(commands: argparse._SubParsersAction) -> None:
    token_map = commands.add_parser(
        "build-token-map",
        help="FR-Spec static vocabulary: the k most frequent tokens of a corpus",
        description="Count tokens over text or JSONL files and save the top k for "
        "--speculative-token-map (the `static` mode's baseline).",
    )
    token_map.add_argument("--tokenizer", type=Path, required=True, help="model or tokenizer dir")
    token_map.add_argument("--corpus", type=Path, nargs="+", required=True, help="text/JSONL files")
    token_map.add_argument("--top-k", type=int, required=True, help="vocabulary size k")
    token_map.add_argument("--output", type=Path, required=True, help="where to save the list")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nanospec", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_serve_command(commands)
    _add_token_map_command(commands)
    add_models_commands(commands)
    add_train_command(commands)
    add_admin_commands(commands)
    add_bench_command(commands)
    add_vocab_commands(commands)
    return parser


def build_token_map_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.top_k < 1:
        parser.error("--top-k: must be at least 1")
    missing = [str(p) for p in args.corpus if not p.is_file()]
    if missing:
        parser.error(f"--corpus: no such file: {', '.join(missing)}")

    count = build_token_map(args.tokenizer, args.corpus, args.top_k, args.output)
    print(f"nanospec: wrote {count} token ids to {args.output}")
    return 0


def _config_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> NanoSpecConfig:
    try:
        return NanoSpecConfig(
            mode=Mode(args.nanospec_mode),
            w_max=args.nanospec_w_max,
            w_cap=args.nanospec_w_cap or args.nanospec_w_max,
            k_pre=args.nanospec_k_pre,
            k_ver=args.nanospec_k_ver,
            union_capacity=args.nanospec_union_capacity,
            prior_k=args.nanospec_prior_k,
            adaptive=args.nanospec_adaptive,
            adaptive_by_default=args.adaptive_by_default,
            adaptive_skip_extend=not args.nanospec_adaptive_keep_extend,
            adaptive_plain=not args.nanospec_adaptive_verify_depth_0,
            adaptive_policy=args.nanospec_adaptive_policy or DEFAULT_POLICY,
            adaptive_calibration=str(args.nanospec_adaptive_calibration.resolve())
            if args.nanospec_adaptive_calibration
            else None,
        )
    except ValidationError as error:
        problems = "; ".join(
            f"--nanospec-{'-'.join(str(p) for p in e['loc']).replace('_', '-')}: {e['msg']}"
            if e["loc"]
            else e["msg"]
            for e in error.errors()
        )
        parser.error(problems)


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _check_flags(config: NanoSpecConfig, argv: list[str], parser: argparse.ArgumentParser) -> None:
    workers = _flag_value(argv, "--tokenizer-worker-num")
    if workers is not None and workers != "1":
        # SGLang's extra tokenizer workers never load plugins, so our routes would vanish.
        parser.error("--tokenizer-worker-num: nanospec serve supports only 1 tokenizer worker")
    has_token_map = _flag_value(argv, "--speculative-token-map") is not None
    # An EAGLE-3 head brings its own list (d2t); the draft worker refuses one without it.
    eagle3 = (_flag_value(argv, "--speculative-algorithm") or "").upper() == "EAGLE3"
    if config.mode == Mode.STATIC and not has_token_map and not eagle3:
        parser.error(
            "--nanospec-mode static needs --speculative-token-map (see build-token-map), "
            "or an EAGLE-3 head with a d2t list (--speculative-algorithm EAGLE3)"
        )
    if config.mode.is_dynamic and has_token_map:
        parser.error(f"--speculative-token-map: not with --nanospec-mode {config.mode.value}")
    if config.mode.is_dynamic and "--speculative-use-rejection-sampling" in argv:
        parser.error(
            "--speculative-use-rejection-sampling: not with a dynamic vocabulary; sampling "
            "without it verifies against the target's distribution alone, which is exact"
        )
    tp = _flag_value(argv, "--tp-size") or _flag_value(argv, "--tp")
    if eagle3 and config.mode.is_dynamic and tp not in (None, "1"):
        # The draft worker refuses it too, but only after loading both models.
        parser.error(
            f"--tp-size: --nanospec-mode {config.mode.value} with an EAGLE-3 head runs at "
            "--tp-size 1 only (its draft vocabulary is not sharded); use full or static with it"
        )
    if config.adaptive and "--speculative-adaptive" in argv:
        parser.error(
            "--nanospec-adaptive: not with --speculative-adaptive (SGLang's own policy); pick one"
        )


def _check_extend_flags(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    if args.nanospec_adaptive_keep_extend and not args.nanospec_adaptive:
        parser.error("--nanospec-adaptive-keep-extend: needs --nanospec-adaptive")
    if args.nanospec_adaptive_verify_depth_0 and not args.nanospec_adaptive:
        parser.error("--nanospec-adaptive-verify-depth-0: needs --nanospec-adaptive")
    if args.nanospec_adaptive_policy is not None and not args.nanospec_adaptive:
        parser.error("--nanospec-adaptive-policy: needs --nanospec-adaptive")
    if args.nanospec_adaptive_calibration is not None:
        if not args.nanospec_adaptive:
            parser.error("--nanospec-adaptive-calibration: needs adaptive speculation")
        if args.nanospec_adaptive_policy not in (None, DEFAULT_POLICY):
            parser.error(
                "--nanospec-adaptive-calibration: the "
                f"{args.nanospec_adaptive_policy} policy has no cost model to calibrate"
            )
        try:
            read_calibration(args.nanospec_adaptive_calibration)
        except ValueError as error:
            parser.error(f"--nanospec-adaptive-calibration: {error}")


def _admin_key_from_env(parser: argparse.ArgumentParser) -> str | None:
    """$NANOSPEC_ADMIN_KEY, or the file $NANOSPEC_ADMIN_KEY_FILE names (a Docker secret)."""
    key_file = env.admin_key_file()
    if env.admin_key() or not key_file:
        return env.admin_key()
    try:
        key = Path(key_file).read_text().strip()
    except OSError as error:
        parser.error(f"{env.ADMIN_KEY_FILE}: cannot read {key_file}: {error.strerror}")
    if not key:
        parser.error(f"{env.ADMIN_KEY_FILE}: {key_file} is empty")
    return key


def _default_prior_k(args: argparse.Namespace, sglang_argv: list[str]) -> int:
    embedded = _flag_value(sglang_argv, "--model-path") is None and not args.tiny
    return defaults.DEFAULT_CPU_PRIOR_K if embedded and not host.has_cuda() else 0


def _resolve_adaptive(args: argparse.Namespace, sglang_argv: list[str]) -> None:
    """Adaptive speculation unless asked otherwise: on a CPU, for a speculative server
    (the embedded defaults are), without SGLang's own policy (`--speculative-adaptive`)."""
    args.adaptive_by_default = args.nanospec_adaptive is None
    if not args.adaptive_by_default:
        return
    speculative = _flag_value(sglang_argv, "--model-path") is None or (
        _flag_value(sglang_argv, "--speculative-algorithm") is not None
    )
    sglang_policy = "--speculative-adaptive" in sglang_argv
    args.nanospec_adaptive = speculative and not host.has_cuda() and not sglang_policy
    if speculative and sglang_policy:
        print("nanospec: --speculative-adaptive: SGLang's policy chooses the depth; ours is off")


def serve(args: argparse.Namespace, sglang_argv: list[str], parser: argparse.ArgumentParser) -> int:
    if args.nanospec_prior_k is None:
        args.nanospec_prior_k = _default_prior_k(args, sglang_argv)
    _resolve_adaptive(args, sglang_argv)
    config = _config_from(args, parser)
    _check_flags(config, sglang_argv, parser)
    _check_extend_flags(args, parser)
    if args.nanospec_stats_history < 1:
        parser.error("--nanospec-stats-history: must be at least 1")
    os.environ[env.STATS_HISTORY] = str(args.nanospec_stats_history)
    admin_key = _admin_key_from_env(parser)
    if admin_key and _flag_value(sglang_argv, "--admin-api-key") is None:
        # From the environment (Docker secrets, compose), so it never shows in `ps`.
        sglang_argv = sglang_argv + ["--admin-api-key", admin_key]

    on_cpu = not host.has_cuda()
    if on_cpu:
        host.prepare_cpu_environment()
        sglang_argv = sglang_argv + host.cpu_flags_missing_from(sglang_argv)
        adaptive = config.adaptive or "--speculative-adaptive" in sglang_argv
        if adaptive and "--disable-cuda-graph" not in sglang_argv:
            # Building a runtime state per depth asks for a decode graph runner unless
            # graphs are off, and a CPU attention backend has none.
            sglang_argv = sglang_argv + ["--disable-cuda-graph"]
    if _flag_value(sglang_argv, "--model-path") is None:
        try:
            embedded = defaults.tiny_serve_argv() if args.tiny else defaults.default_serve_argv()
        except ModelPrepareError as error:
            parser.exit(
                2,
                f"nanospec: error: the default model is not available ({error}); "
                "pass --model-path, or --tiny for the offline test models\n",
            )
        sglang_argv = embedded + sglang_argv
    if _flag_value(sglang_argv, "--served-model-name") is None:
        name = served_name(_flag_value(sglang_argv, "--model-path"))
        if name is not None:
            sglang_argv = sglang_argv + ["--served-model-name", name]
    os.environ[env.CONFIG] = config.to_env()

    # SGLang is imported only now, after the environment its platform detection reads.
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(sglang_argv)
    server_args.resolve_once()
    if not _port_free(server_args.host, server_args.port):
        parser.exit(
            2, f"nanospec: error: --port: {server_args.host}:{server_args.port} is in use\n"
        )
    if on_cpu:
        from nanospec_server.memory_check import check_server

        if (refused := check_server(server_args, config)) is not None:
            parser.exit(2, f"nanospec: error: not enough memory: {refused}\n")
        host.bind_cpu_ranks(server_args.tp_size * server_args.dp_size * server_args.pp_size)
    host.redact_from_logs(server_args.admin_api_key, server_args.api_key)

    url = f"http://{server_args.host}:{server_args.port}"
    # Until uvicorn installs its own handlers, SIGTERM's default would end this process at
    # once and orphan SGLang's processes: let it stop the way Ctrl-C does.
    signal.signal(signal.SIGTERM, _interrupt)
    print(f"nanospec: starting {server_args.model_path} ({config.mode.value})", flush=True)
    try:
        launch_server(server_args, launch_callback=lambda: _announce(url, server_args.port))
    except KeyboardInterrupt:
        pass  # Ctrl-C before uvicorn took over the signal; it stops the same way
    except SystemExit as stop:
        if stop.code == UVICORN_STARTUP_FAILURE:
            print(
                f"nanospec: error: could not listen on {server_args.host}:{server_args.port} "
                "(is another process on that port? pick another --port)",
                file=sys.stderr,
                flush=True,
            )
        raise
    finally:
        # After SIGINT uvicorn shuts down gracefully and launch_server simply returns, or
        # the interrupt lands here first: either way this is the one place that reports it.
        engine_watch.expect_shutdown()  # SGLang's processes now end on purpose
        print("nanospec: stopped", flush=True)
        kill_process_tree(os.getpid(), include_parent=False)
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _port_free(host: str, port: int) -> bool:
    """Can a server bind ``host:port`` now? Checked before minutes of model loading; the
    bind itself can still lose a race, which uvicorn reports (see ``serve``)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _announce(url: str, port: int) -> None:
    """SGLang's launch callback: "ready" only once this process serves the port (a client
    polling it could otherwise be answered by whoever else took the port)."""
    if listening_here(port):
        print(f"nanospec: ready at {url}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "serve":
        return serve(args, rest, parser)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "build-token-map":
        return build_token_map_command(args, parser)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
