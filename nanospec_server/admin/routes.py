"""HTTP routes nanospec-server adds to SGLang's FastAPI app.

Live settings travel through SGLang's own internal-state channel to the scheduler
(`sglang_plugin/live_settings.py` handles them there); these routes validate first, so
a bad value is a 400 with a message (SGLang's convention) instead of a silent `false`.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from nanospec_server.config import NanoSpecConfig

ROUTE_PREFIX = "/nanospec"


class SettingsUpdate(BaseModel):
    """Any subset of the live settings."""

    model_config = ConfigDict(extra="forbid")

    w_max: int | None = Field(None, ge=1)
    k_pre: int | None = Field(None, ge=0, le=64)
    k_ver: int | None = Field(None, ge=0, le=64)


async def _scheduler_state() -> dict[str, Any]:
    from sglang.srt.entrypoints.http_server import _global_state

    states = await _global_state.tokenizer_manager.get_internal_state()
    state = states[0].get("nanospec") if states else None
    if state is None:
        raise HTTPException(409, "this server runs no NanoSpec draft worker")
    return state


async def _push_settings(changes: dict[str, int]) -> None:
    from sglang.srt.entrypoints.http_server import _global_state
    from sglang.srt.managers.io_struct import SetInternalStateReq

    request = SetInternalStateReq(server_args={f"nanospec_{k}": v for k, v in changes.items()})
    updated = await _global_state.tokenizer_manager.set_internal_state(request)
    if not all(updated):
        raise HTTPException(409, "the scheduler refused the update (see the server log)")


def build_router() -> APIRouter:
    router = APIRouter(tags=["nanospec"])

    @router.get(f"{ROUTE_PREFIX}/config")
    def launch_config() -> NanoSpecConfig:
        """The NanoSpec settings this server was launched with."""
        return NanoSpecConfig.from_env()

    @router.get(f"{ROUTE_PREFIX}/settings")
    async def live_settings() -> NanoSpecConfig:
        """The settings in force now (after any live change)."""
        return NanoSpecConfig.model_validate((await _scheduler_state())["config"])

    @router.post(f"{ROUTE_PREFIX}/settings")
    async def change_settings(update: SettingsUpdate) -> NanoSpecConfig:
        """Change W_max / K_pre / K_ver; effective at the next speculative step."""
        changes = update.model_dump(exclude_none=True)
        current = NanoSpecConfig.model_validate((await _scheduler_state())["config"])
        if "w_max" in changes and changes["w_max"] > current.w_cap:
            raise HTTPException(
                400, f"w_max {changes['w_max']} exceeds the capacity w_cap {current.w_cap}"
            )
        if changes:
            await _push_settings(changes)
        return NanoSpecConfig.model_validate((await _scheduler_state())["config"])

    @router.get("/stats/vocab")
    async def vocab_stats() -> dict[str, Any]:
        """Settings, state size and the statistics of recently finished requests."""
        return await _scheduler_state()

    return router


def install_routes(app: FastAPI) -> None:
    if any(getattr(route, "path", "").startswith(ROUTE_PREFIX) for route in app.routes):
        return  # plugins may load twice in one process
    app.include_router(build_router())
