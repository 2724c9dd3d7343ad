"""Live W_max / K_pre / K_ver through SGLang's internal-state channel.

`POST /set_internal_state {"server_args": {"nanospec_w_max": 512}}` reaches the scheduler's
`SchedulerInternalStateController`; we add handlers for our keys beside SGLang's own, and
our runtime's state to `/get_internal_state`. A change applies at the next speculative step.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sglang.srt.managers.scheduler_components.internal_state import (
    UpdateRejected,
    _UpdateHandler,
)

from nanospec_server.sglang_plugin import runtime

SETTING_KEYS = {"nanospec_w_max": "w_max", "nanospec_k_pre": "k_pre", "nanospec_k_ver": "k_ver"}


def _validate(key: str, value: Any) -> None:
    if runtime.RUNTIME is None:
        raise UpdateRejected(f"{key}: this server runs no NanoSpec draft worker")
    field = SETTING_KEYS[key]
    try:
        runtime.RUNTIME.config.model_validate(runtime.RUNTIME.config.model_dump() | {field: value})
    except ValidationError as error:
        raise UpdateRejected(f"{key}: {error.errors()[0]['msg']}") from error


def _apply(key: str, value: Any) -> None:
    runtime.RUNTIME.update_settings(**{SETTING_KEYS[key]: value})


def update_handlers_hook(original, controller) -> dict:
    handlers = original(controller)
    for key in SETTING_KEYS:
        handlers[key] = _UpdateHandler(_validate, _apply)
    return handlers


def get_internal_state_hook(result, controller, recv_req):
    if runtime.RUNTIME is not None:
        result.internal_state["nanospec"] = runtime.RUNTIME.state()
    return result
