"""The SGLang plugin entry point (`sglang.srt.plugins` group, see pyproject.toml).

SGLang calls `register` in each of its processes: the launcher, the scheduler, the
detokenizer and the DP controller. Each piece hooks in only where it belongs.
"""

from __future__ import annotations

import logging
import sys

logger = logging.getLogger(__name__)

HTTP_SERVER_MODULE = "sglang.srt.entrypoints.http_server"
SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
TOKENIZER_MANAGER_MODULE = "sglang.srt.managers.tokenizer_manager"


def register() -> None:
    # The HTTP app exists only in the launcher, which has imported the server module by
    # the time SGLang loads plugins; importing it elsewhere would cost seconds for nothing.
    http_server = sys.modules.get(HTTP_SERVER_MODULE)
    if http_server is not None:
        from nanospec_server.admin.routes import install_routes

        install_routes(http_server.app)
        logger.info("nanospec: admin routes installed")
    if TOKENIZER_MANAGER_MODULE in sys.modules:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        from nanospec_server.sglang_plugin.request_checks import check_input_ids

        HookRegistry.register(
            f"{TOKENIZER_MANAGER_MODULE}.TokenizerManager._validate_one_request",
            check_input_ids,
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
