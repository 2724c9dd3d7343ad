"""Live settings and published statistics through SGLang's internal-state channel.

`/set_internal_state` reaches the scheduler's `SchedulerInternalStateController`; we add
one handler, `nanospec_settings`, beside SGLang's own. Its value carries the changes, the
id of the admin key that asked (for the log) and a per-launch token that only the admin
layer knows: SGLang's `/set_internal_state` needs no key when the server has none, so the
token keeps it from being a way around `POST /nanospec/settings`'s key check.

`/get_internal_state` gets our state: settings, totals, the running requests and the
recently finished ones. A change applies at the next speculative step.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError
from sglang.srt.managers.scheduler_components.internal_state import (
    UpdateRejected,
    _UpdateHandler,
)

from nanospec_server.adaptive.live import live_change_problem
from nanospec_server.admin.state_channel import SETTINGS_KEY, STATE_KEY, token_matches
from nanospec_server.sglang_plugin.spec import runtime
from nanospec_server.sglang_plugin.spec.step_context import current
from nanospec_server.sglang_plugin.stats import metrics

logger = logging.getLogger(__name__)


def _validate(key: str, value: Any) -> None:
    rt = current().runtime
    if rt is None:
        raise UpdateRejected(f"{key}: this server runs no NanoSpec draft worker")
    token = value.get("token") if isinstance(value, dict) else None
    if not token_matches(token):
        raise UpdateRejected(f"{key}: change NanoSpec settings through POST /nanospec/settings")
    from nanospec_server.sglang_plugin.spec import adaptive

    if problem := live_change_problem(value["changes"], adaptive.live_change_state()):
        raise UpdateRejected(problem)
    try:
        rt.config.model_validate(rt.config.model_dump() | value["changes"])
    except ValidationError as error:
        raise UpdateRejected(f"{key}: {error.errors()[0]['msg']}") from error


def _apply(key: str, value: dict[str, Any]) -> None:
    from nanospec_server.sglang_plugin.spec import adaptive

    rt = current().runtime
    old = rt.config
    rt.update_settings(**value["changes"])
    new = rt.config
    adaptive.apply_live(new)
    changed = {k: (getattr(old, k), getattr(new, k)) for k in value["changes"]}
    logger.info(
        "nanospec: settings changed by admin key %s: %s",
        value["key_id"],
        ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items()),
    )
    metrics.settings_changed(value["changes"])
    metrics.w_max_in_force(new.w_max)


def update_handlers_hook(original, controller) -> dict:
    handlers = original(controller)
    handlers[SETTINGS_KEY] = _UpdateHandler(_validate, _apply)
    return handlers


def get_internal_state_hook(result, controller, recv_req):
    if (rt := current().runtime) is not None:
        result.internal_state[STATE_KEY] = published_state(rt)
    return result


def published_state(rt: runtime.NanoSpecRuntime) -> dict:
    """What the admin layer reads: never any prompt or output text, only counts."""
    from sglang.srt.runtime_context import get_parallel

    from nanospec_server.sglang_plugin.spec import adaptive

    stats = rt.stats
    # A request can finish without its last chunk reaching our streamer (an abort);
    # snapshotting it here files it under finished instead of leaving it "running".
    ended = [req for req in stats.running_reqs() if req.finished()]
    if ended:
        rt.snapshot(ended)  # files them through `remember_finished`
    reqs = stats.running_reqs()
    running = stats.describe_running(rt.snapshot(reqs)) if reqs else []
    memory = rt.memory_report()
    return {
        "dp_rank": get_parallel().dp_rank or 0,
        "config": rt.config.model_dump(mode="json"),
        "vocab_size": rt.vocab_size,
        "state_bytes": memory["total_bytes"],
        "memory": memory,
        "started_at": stats.started_at,
        "history_size": stats.history,
        "totals": stats.totals_dict(),
        "running": running,
        "finished": list(stats.finished.values()),
        "adaptive": adaptive.published(),
    }
