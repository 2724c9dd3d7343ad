"""The SGLang plugin entry point (`sglang.srt.plugins` group, see pyproject.toml).

SGLang calls `register` in each of its processes: the launcher, the scheduler, the
detokenizer and the DP controller. Each piece hooks in only where it belongs.
"""

from __future__ import annotations

import logging
import socket
import sys
import time

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
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        from nanospec_server.admin.routes import install_routes
        from nanospec_server.sglang_plugin.live_settings import ensure_token

        ensure_token()  # before SGLang spawns the schedulers, which inherit it
        install_routes(http_server.app)
        HookRegistry.register(
            f"{HTTP_SERVER_MODULE}._freeze_gc_after_server_warmup",
            freeze_gc_once_listening,
            HookType.AROUND,
        )
        from nanospec_server import engine_watch

        HookRegistry.register(
            f"{TOKENIZER_MANAGER_MODULE}.SignalHandler.running_phase_sigquit_handler",
            engine_watch.sigquit_hook,
            HookType.AROUND,
        )
        HookRegistry.register(
            "sglang.srt.utils.watchdog.SubprocessWatchdog._check_processes",
            engine_watch.check_processes_hook,
            HookType.AROUND,
        )
        for exit_handler in (
            "uvicorn.server.Server.handle_exit",  # Ctrl-C, SIGTERM before SGLang's loop runs
            f"{TOKENIZER_MANAGER_MODULE}.SignalHandler.sigterm_handler",
        ):
            HookRegistry.register(exit_handler, engine_watch.expect_shutdown, HookType.BEFORE)
        logger.info("nanospec: admin routes installed")
    if TOKENIZER_MANAGER_MODULE in sys.modules:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        from nanospec_server.sglang_plugin import request_checks

        for check in (request_checks.check_input_ids, request_checks.check_w_max_override):
            HookRegistry.register(
                f"{TOKENIZER_MANAGER_MODULE}.TokenizerManager._validate_one_request",
                check,
                HookType.BEFORE,
            )
    # Draft-worker hooks wait for a Scheduler to be built, so only scheduler processes
    # import the speculative modules (and only when speculation is on).
    if SCHEDULER_MODULE in sys.modules:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        from nanospec_server.sglang_plugin.scheduler_hooks import install_scheduler_hooks

        HookRegistry.register(
            f"{SCHEDULER_MODULE}.Scheduler.__init__", install_scheduler_hooks, HookType.BEFORE
        )


def freeze_gc_once_listening(original, server_args) -> None:
    """SGLang's post-warmup `/freeze_gc` call, once uvicorn accepts connections.

    With `--skip-server-warmup` the warmup thread posts `/freeze_gc` as soon as it starts,
    racing uvicorn's bind: a connection-refused traceback in the log, and the GC freeze
    lost. Waiting for the port makes it deterministic; a server stopped before it ever
    listened skips the call instead of logging a traceback.
    """
    host = "127.0.0.1" if server_args.host in ("0.0.0.0", "::") else server_args.host
    deadline = time.monotonic() + LISTEN_WAIT_S
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host, server_args.port), timeout=1).close()
        except OSError:
            time.sleep(0.1)
            continue
        return original(server_args)
    logger.info("nanospec: server not listening; post-warmup freeze_gc skipped")
