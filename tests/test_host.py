"""Host settings: the scheduler's CPU threads."""

from __future__ import annotations

import torch

from nanospec_server.env import CPU_THREADS
from nanospec_server.host import default_cpu_threads, scheduler_cpu_threads


def test_small_hosts_use_every_core_large_ones_leave_two() -> None:
    assert [default_cpu_threads(n) for n in (1, 2, 3, 4, 5, 8, 64)] == [1, 2, 3, 4, 4, 6, 62]


def test_environment_overrides_the_default(monkeypatch) -> None:
    monkeypatch.setenv(CPU_THREADS, "3")
    assert scheduler_cpu_threads() == 3


def test_keys_are_redacted_from_log_records(caplog) -> None:
    import logging

    from nanospec_server.host import redact_from_logs

    factory = logging.getLogRecordFactory()
    try:
        redact_from_logs("k", None)
        logger = logging.getLogger("sglang.srt.server_args_test")
        with caplog.at_level(logging.INFO):
            logger.info("server_args=%s", {"admin_api_key": "k", "host": "127.0.0.1"})
            logger.info("kill_process_tree called")
        assert "'admin_api_key': '<redacted>'" in caplog.text
        assert "'k'" not in caplog.text and "kill_process_tree called" in caplog.text
    finally:
        logging.setLogRecordFactory(factory)


def test_cpu_flags_add_sleep_on_idle_once() -> None:
    from nanospec_server.host import cpu_flags_missing_from

    added = cpu_flags_missing_from(["--model-path", "m"])
    assert added.count("--sleep-on-idle") == 1 and "--device" in added
    assert "--sleep-on-idle" not in cpu_flags_missing_from(["--sleep-on-idle", "--device", "cpu"])


def test_cpu_dtype_is_float32_without_native_bf16(monkeypatch) -> None:
    from nanospec_server import host

    monkeypatch.setattr(host, "cpu_has_fast_bf16", lambda: False)
    added = host.cpu_flags_missing_from(["--model-path", "m"])
    assert added[added.index("--dtype") + 1] == "float32"
    assert "--dtype" not in host.cpu_flags_missing_from(["--dtype", "bfloat16"])
    monkeypatch.setattr(host, "cpu_has_fast_bf16", lambda: True)
    assert "--dtype" not in host.cpu_flags_missing_from(["--model-path", "m"])


def test_bitwise_lossless_needs_fp32_or_bf16_our_kernels_and_no_gpu(monkeypatch) -> None:
    from nanospec_server import host

    if host.has_cuda():
        assert not host.bitwise_lossless("float32")
        return
    monkeypatch.setenv("NANOSPEC_CPU_SHIM", "1")
    assert host.bitwise_lossless("float32") == torch.backends.mkldnn.is_available()
    assert host.bitwise_lossless("bfloat16") == torch.backends.mkldnn.is_available()
    assert not host.bitwise_lossless("float16")  # not packed: F.linear serves it
    monkeypatch.setenv("NANOSPEC_CPU_LINEAR", "0")  # F.linear's GEMV and GEMM round apart
    assert not host.bitwise_lossless("float32")
    monkeypatch.setenv("NANOSPEC_CPU_LINEAR", "1")
    monkeypatch.setenv("NANOSPEC_CPU_SHIM", "0")  # SGLang's own CPU kernels
    assert not host.bitwise_lossless("float32")


def test_tp_ranks_get_their_own_cores(monkeypatch) -> None:
    from nanospec_server import host

    assert host.threads_bind(2, [0, 1]) == "0|1"
    assert host.threads_bind(2, [0, 1, 2, 3, 4]) == "0,1|2,3,4"
    assert host.threads_bind(3, [0, 1]) == "0|1|0"  # more ranks than cores: they share
    monkeypatch.setattr(host, "numa_nodes", lambda: 1)
    monkeypatch.setattr(host.os, "sched_getaffinity", lambda _: {0, 1})
    monkeypatch.delenv(host.THREADS_BIND_ENV, raising=False)
    host.bind_cpu_ranks(1)  # one rank: SGLang's own NUMA binding works
    assert host.THREADS_BIND_ENV not in host.os.environ
    host.bind_cpu_ranks(2)
    assert host.os.environ[host.THREADS_BIND_ENV] == "0|1"
    monkeypatch.setenv(host.THREADS_BIND_ENV, "1|0")
    host.bind_cpu_ranks(2)  # the user's binding stays
    assert host.os.environ[host.THREADS_BIND_ENV] == "1|0"


def test_scheduler_threads_are_shared_by_the_ranks(monkeypatch) -> None:
    monkeypatch.delenv(CPU_THREADS, raising=False)
    monkeypatch.setattr("nanospec_server.host.usable_cores", lambda: 8)
    assert scheduler_cpu_threads(1) == 6
    assert scheduler_cpu_threads(2) == 3
    assert scheduler_cpu_threads(16) == 1
