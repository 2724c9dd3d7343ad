"""What each shipped configuration holds in memory once it has served a request.

Each configuration is started alone (`nanospec serve` with its flags), answers one greedy
request of ``--max-new-tokens``, and its process tree (the launcher and SGLang's
processes) is measured: proportional set size (shared pages split among the processes
that map them) and the sum of resident sets. Beside it, what `nanospec serve`'s memory
check counts for the same configuration before loading anything.

    python benchmarks/memory.py    # the embedded default and its target alone, fp32 and bf16
    python benchmarks/memory.py --configs default-bf16 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import psutil
import requests

from nanospec_server.config import NanoSpecConfig
from nanospec_server.launch.server import running_server_processes
from nanospec_server.memory_check import (
    DEFAULT_RUNNING_REQUESTS,
    GIB,
    needs_of,
    packed_head_bytes,
    served_dtype_bytes,
)
from nanospec_server.models.defaults import DEFAULT_DRAFT, default_serve_argv
from nanospec_server.models.prepare import prepare_model


def configs() -> dict[str, tuple[list[str], list[str]]]:
    """name -> (`nanospec serve`'s flags, the same configuration's full SGLang flags)."""
    pair = default_serve_argv()
    plain = pair[:2] + pair[pair.index("--mem-fraction-static") :]
    out = {}
    for dtype, short in (("float32", "fp32"), ("bfloat16", "bf16")):
        out[f"default-{short}"] = (["--dtype", dtype], pair + ["--dtype", dtype])
        out[f"plain-{short}"] = (plain + ["--dtype", dtype], plain + ["--dtype", dtype])
    return out


def tree_memory(root: int) -> tuple[int, int]:
    """(PSS, summed RSS) in bytes of a process and all its descendants."""
    launcher = psutil.Process(root)
    pss = rss = 0
    for process in [launcher, *launcher.children(recursive=True)]:
        try:
            info = process.memory_full_info()
        except psutil.NoSuchProcess:
            continue
        pss, rss = pss + info.pss, rss + info.rss
    return pss, rss


def counted(flags: list[str]) -> int:
    """The memory check's figure for these flags (its defaults where a flag is absent)."""
    target = Path(flags[flags.index("--model-path") + 1])
    draft = Path(prepare_model(DEFAULT_DRAFT)) if "--speculative-algorithm" in flags else None
    dtype = flags[flags.index("--dtype") + 1]
    tokens = int(flags[flags.index("--max-total-tokens") + 1])
    packed = 0
    if draft is not None:  # the default pair runs NanoSpec: window slots and packed rows
        element_size = served_dtype_bytes(dtype, target)
        w_cap = NanoSpecConfig().w_cap
        packed = packed_head_bytes(draft, element_size, w_cap, DEFAULT_RUNNING_REQUESTS)
    return needs_of(target, draft, dtype, tokens, packed, nanospec=draft is not None).total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", choices=list(configs()), default=list(configs()))
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    every = configs()
    print("| configuration | PSS | summed RSS | memory check counts |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.configs:
            serve_flags, full_flags = every[name]
            servers = {name: (serve_flags, Path(tmp) / f"{name}.log")}
            with running_server_processes(servers) as started:
                url, process = started[name]
                body = {
                    "text": "Write a Python function that reverses a list.",
                    "sampling_params": {"temperature": 0, "max_new_tokens": args.max_new_tokens},
                }
                requests.post(f"{url}/generate", json=body, timeout=1200).raise_for_status()
                pss, rss = tree_memory(process.pid)
            print(
                f"| {name} | {pss / GIB:.1f} GiB | {rss / GIB:.1f} GiB | "
                f"{counted(full_flags) / GIB:.1f} GiB |",
                flush=True,
            )


if __name__ == "__main__":
    main()
