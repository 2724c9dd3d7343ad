"""What this host can run SGLang with, and the environment its CPU path needs.

Everything here must happen before SGLang is imported: its platform detection reads
``SGLANG_USE_CPU_ENGINE`` at import time, and the processes it spawns inherit the
environment set here.
"""

from __future__ import annotations

import glob
import logging
import os
import platform
from pathlib import Path

from nanospec_server.env import cpu_threads
from nanospec_server.sgl_kernel_cpu.shim import activate_shim, needs_shim

# Flags that route SGLang's CPU path through attention ops our stand-in provides.
# `torch_native` alone refuses EAGLE; the split prefill/decode flags survive the AMX check.
CPU_SERVER_FLAGS: dict[str, str] = {
    "--device": "cpu",
    "--attention-backend": "torch_native",
    "--prefill-attention-backend": "intel_amx",
    "--decode-attention-backend": "intel_amx",
}

# Switches the CPU path adds unless given. An idle SGLang scheduler polls its sockets in a
# busy loop (most of a core): on a CPU host that core is taken from the server
# that is working, whether that is the HTTP/tokenizer process beside it or, in a
# side-by-side benchmark, another server. With it the scheduler blocks until a request.
CPU_SERVER_SWITCHES: tuple[str, ...] = ("--sleep-on-idle",)

CPU_ENV_DEFAULTS: dict[str, str] = {
    "SGLANG_USE_CPU_ENGINE": "1",
    # One thread per process: the scheduler, the tokenizer and the detokenizer otherwise
    # fight over the cores, and speculative decoding slows down many times over on 2 cores.
    "OMP_NUM_THREADS": "1",
    # torch.compile costs ~20 s on the first speculative request and gains nothing here.
    "TORCHDYNAMO_DISABLE": "1",
}


# Intra-op threads of the scheduler (the process that runs the models); the tokenizer,
# detokenizer and HTTP processes keep OMP_NUM_THREADS=1. SGLang binds threads itself
# (SGLANG_CPU_OMP_THREADS_BIND) only on AMX and arm64 hosts through its real sgl_kernel.


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what the platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    return len(os.sched_getaffinity(0))


def default_cpu_threads(cores: int) -> int:
    """Every core on a small host, else the cores left after the launcher (HTTP +
    tokenizer) and the detokenizer.

    While the scheduler decodes, the launcher and detokenizer barely run, and with
    ``--sleep-on-idle`` no idle scheduler spins beside it, so on an idle 2-core host 2
    scheduler threads beat 1 (docs/results.md, "The CPU path"). On a host loaded with
    other jobs' spinning schedulers more threads can be slower.
    """
    return max(min(cores, 4), cores - 2)


def scheduler_cpu_threads(ranks: int = 1) -> int:
    """$NANOSPEC_CPU_THREADS, else the default for this host's cores shared by the
    ``ranks`` scheduler processes (tensor- and data-parallel ranks), at least one each."""
    value = cpu_threads()
    return value if value is not None else max(default_cpu_threads(usable_cores()) // ranks, 1)


# SGLang's CPU thread binder: one "|"-separated core list per rank (dp x tp x pp).
THREADS_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"


def numa_nodes() -> int:
    return max(len(glob.glob("/sys/devices/system/node/node[0-9]*")), 1)


def threads_bind(ranks: int, cores: list[int]) -> str:
    """``ranks`` groups of ``cores`` for SGLang's binder, contiguous and as even as can be
    ("0|1" for 2 ranks on 2 cores); with fewer cores than ranks, ranks share cores."""
    if len(cores) < ranks:
        return "|".join(str(cores[rank % len(cores)]) for rank in range(ranks))
    groups = [
        cores[rank * len(cores) // ranks : (rank + 1) * len(cores) // ranks]
        for rank in range(ranks)
    ]
    return "|".join(",".join(map(str, group)) for group in groups)


def bind_cpu_ranks(ranks: int) -> None:
    """Give each scheduler rank its cores where SGLang would refuse to start: without
    $SGLANG_CPU_OMP_THREADS_BIND it binds one NUMA node per rank and asserts that there
    are at least as many nodes as ranks (a one-node host fails at --tp-size 2). A value
    the user set is kept. Each rank then runs ``scheduler_cpu_threads(ranks)`` threads."""
    if ranks > numa_nodes() and THREADS_BIND_ENV not in os.environ:
        os.environ[THREADS_BIND_ENV] = threads_bind(ranks, sorted(os.sched_getaffinity(0)))


def has_cuda() -> bool:
    # deferred: imports torch only when called
    import torch

    return torch.cuda.is_available()


def prepare_cpu_environment() -> bool:
    """Set the CPU path's environment (keeping what the user set) and our sgl_kernel stand-in.

    Returns whether the stand-in was activated (False when a real sgl_kernel loads).
    """
    for name, value in CPU_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    return activate_shim()


def cpu_has_fast_bf16() -> bool:
    # deferred: imports torch only when called
    import torch

    return torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported()


def cpu_default_dtype() -> str | None:
    """``float32`` where the CPU has no native bf16 matmul (no AMX, no AVX512-BF16), else
    None (the checkpoint's dtype). There bf16 matmuls are emulated and grow with the tokens
    of a pass, while fp32 runs our oneDNN packed kernels (``sglang_plugin/cpu/linear.py``),
    which speculation needs (docs/results.md, "The CPU path").
    """
    return None if cpu_has_fast_bf16() else "float32"


def bitwise_lossless(dtype: str) -> bool:
    """Is speculative greedy output bit-identical to plain decoding here? On a CPU in fp32
    or bf16 through our stand-in and packed linears, yes: every op on the target's path
    computes a position the same way in a decode, a verify and any prefill chunk
    (docs/cpu.md, "Exactness")."""
    from nanospec_server.ops.packed_linear import enabled as packed_linears  # deferred: torch

    if has_cuda() or dtype not in ("float32", "bfloat16") or not packed_linears():
        return False
    # Our stand-in must serve attention: SGLang's own CPU kernels make no such promise.
    return needs_shim()


def cpu_flags_missing_from(argv: list[str]) -> list[str]:
    """The CPU flags the user has not set themselves, as an argv fragment."""
    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    extra: list[str] = []
    if "--dtype" not in given and (dtype := cpu_default_dtype()) is not None:
        extra += ["--dtype", dtype]
    for flag, value in CPU_SERVER_FLAGS.items():
        if flag not in given:
            extra += [flag, value]
    return extra + [switch for switch in CPU_SERVER_SWITCHES if switch not in given]


def redact_from_logs(*secrets: str | None) -> None:
    """Keep keys out of this process's log: SGLang logs every server argument at start.

    A log-record factory sees each record before any handler formats it, whichever logger
    it came from; the processes SGLang spawns log no server arguments.
    """
    # Quoted, as SGLang's `server_args=` line prints them: a bare short key would also
    # match inside ordinary words.
    secrets = tuple(repr(s) for s in secrets if s)
    if not secrets:
        return
    make_record = logging.getLogRecordFactory()

    def redacting_factory(*args, **kwargs) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return record  # a malformed record: its handler reports it
        if any(secret in message for secret in secrets):
            for secret in secrets:
                message = message.replace(secret, "'<redacted>'")
            record.msg, record.args = message, None
        return record

    logging.setLogRecordFactory(redacting_factory)
