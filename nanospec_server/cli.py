"""`nanospec`: the command line of nanospec-server."""

from __future__ import annotations

import argparse
import os
import sys

from pydantic import ValidationError

from nanospec_server.config import CONFIG_ENV, Mode, NanoSpecConfig


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nanospec", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_serve_command(commands)
    return parser


def _config_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> NanoSpecConfig:
    try:
        return NanoSpecConfig(
            mode=Mode(args.nanospec_mode),
            w_max=args.nanospec_w_max,
            w_cap=args.nanospec_w_cap or args.nanospec_w_max,
            k_pre=args.nanospec_k_pre,
            k_ver=args.nanospec_k_ver,
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


def serve(args: argparse.Namespace, sglang_argv: list[str], parser: argparse.ArgumentParser) -> int:
    config = _config_from(args, parser)
    workers = _flag_value(sglang_argv, "--tokenizer-worker-num")
    if workers is not None and workers != "1":
        # SGLang's extra tokenizer workers never load plugins, so our routes would vanish.
        parser.error("--tokenizer-worker-num: nanospec serve supports only 1 tokenizer worker")

    from nanospec_server import host

    on_cpu = not host.has_cuda()
    if on_cpu:
        host.prepare_cpu_environment()
        sglang_argv = sglang_argv + host.cpu_flags_missing_from(sglang_argv)
    if _flag_value(sglang_argv, "--model-path") is None:
        from nanospec_server.models.defaults import default_serve_argv

        sglang_argv = default_serve_argv() + sglang_argv
    os.environ[CONFIG_ENV] = config.to_env()

    # SGLang is imported only now, after the environment its platform detection reads.
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    server_args = prepare_server_args(sglang_argv)
    server_args.resolve_once()
    url = f"http://{server_args.host}:{server_args.port}"
    print(f"nanospec: starting {server_args.model_path} ({config.mode.value})", flush=True)
    try:
        launch_server(server_args, launch_callback=lambda: print(f"nanospec: ready at {url}", flush=True))
    except KeyboardInterrupt:
        print("nanospec: stopped", flush=True)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "serve":
        return serve(args, rest, parser)
    parser.error(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
