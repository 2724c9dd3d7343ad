"""The SGLang plugin entry point (`sglang.srt.plugins` group, see pyproject.toml).

SGLang calls `register` in each of its processes: the launcher, the scheduler, the
detokenizer and the DP controller. Each piece hooks in only where it belongs.
"""

from __future__ import annotations

import logging
import os
import sys
import time

from nanospec_server import seams

logger = logging.getLogger(__name__)

HTTP_SERVER_MODULE = "sglang.srt.entrypoints.http_server"
SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
TOKENIZER_MANAGER_MODULE = "sglang.srt.managers.tokenizer_manager"
LISTEN_WAIT_S = 60.0


def register() -> None:
    # The HTTP app exists only in the launcher, which has imported the server module by
    # the time SGLang loads plugins; importing it elsewhere would cost seconds for nothing.
    http_server = sys.modules.get(HTTP_SERVER_MODULE)
    if http_server is not None:
        from nanospec_server.admin.routes import install_routes
        from nanospec_server.admin.state_channel import ensure_token
        from nanospec_server.sglang_plugin.requests.chat_body import ChatBodyCheck

        ensure_token()  # before SGLang spawns the schedulers, which inherit it
        install_routes(http_server.app)
        if not any(m.cls is ChatBodyCheck for m in http_server.app.user_middleware):
            http_server.app.add_middleware(ChatBodyCheck)  # plugins may load twice
        seams.hook(seams.FREEZE_GC_AFTER_WARMUP, freeze_gc_once_listening)
        from nanospec_server import engine_watch

        seams.hook(seams.SIGQUIT_HANDLER, engine_watch.sigquit_hook)
        seams.hook(seams.WATCHDOG_CHECK, engine_watch.check_processes_hook)
        for exit_handler in (seams.UVICORN_EXIT, seams.SIGTERM_HANDLER):
            seams.hook(exit_handler, engine_watch.expect_shutdown)
        logger.info("nanospec: admin routes installed")
    if TOKENIZER_MANAGER_MODULE in sys.modules:
        from nanospec_server.sglang_plugin.requests import checks as request_checks

        checks = (
            request_checks.check_input_ids,
            request_checks.check_w_max_override,
            request_checks.check_stats_every_chunk,
            request_checks.check_stop_regex,
            request_checks.check_float32_sampling_values,
        )
        for check in checks:
            seams.hook(seams.VALIDATE_REQUEST, check)
    # Draft-worker hooks wait for a Scheduler to be built, so only scheduler processes
    # import the speculative modules (and only when speculation is on).
    if SCHEDULER_MODULE in sys.modules:
        from nanospec_server.sglang_plugin.scheduler_hooks import install_scheduler_hooks

        seams.hook(seams.SCHEDULER_INIT, install_scheduler_hooks)


def port_listeners(port: int) -> set[int | None]:
    """The pids listening on TCP ``port``, from one snapshot of the host's sockets (None
    for a socket whose owner this user may not see)."""
    import psutil

    return {
        c.pid
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == port
    }


def listening_here(port: int) -> bool:
    """Does this process hold a listening TCP socket on ``port``?"""
    return os.getpid() in port_listeners(port)


def freeze_gc_once_listening(original, server_args) -> None:
    """SGLang's post-warmup `/freeze_gc` call, once our uvicorn listens.

    With `--skip-server-warmup` the warmup thread posts `/freeze_gc` as soon as it starts,
    racing uvicorn's bind: a connection-refused traceback in the log, and the GC freeze
    lost. Waiting for this process to listen makes it deterministic. A connection that
    merely succeeds is not enough: where another process took the port first, it would
    post our `/freeze_gc` to that server (10 s, then a timeout) while our bind fails, so
    then the call is skipped at once and `nanospec serve` reports the port.
    """
    port = server_args.port
    deadline = time.monotonic() + LISTEN_WAIT_S
    while time.monotonic() < deadline:
        listeners = port_listeners(port)
        if os.getpid() in listeners:
            return original(server_args)
        # None is a socket no process owns in this snapshot: ours, caught between its
        # bind and psutil's scan of our file descriptors, or another user's; wait on it.
        if listeners - {None}:
            break  # another process listens there: our bind fails
        time.sleep(0.1)
    logger.info("nanospec: server not listening on port %d; post-warmup freeze_gc skipped", port)
