"""HTTP routes nanospec-server adds to SGLang's FastAPI app (and so to its OpenAPI schema).

Statistics and live settings travel through SGLang's own internal-state channel to the
schedulers (`sglang_plugin/stats/live_settings.py` handles them there, one per DP rank). Bodies
are validated here first, so a bad value is a 4xx naming the field instead of a silent
`false` from the scheduler.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nanospec_server.adaptive.live import live_change_problem
from nanospec_server.admin.auth import require_admin
from nanospec_server.admin.state_channel import STATE_KEY, settings_request
from nanospec_server.admin.stats_models import RequestEntry, RequestState, VocabStats, vocab_stats
from nanospec_server.config import NanoSpecConfig

logger = logging.getLogger(__name__)

ROUTE_PREFIX = "/nanospec"
STATIC_DIR = Path(__file__).parent / "static"
MAX_SETTINGS_BODY = 4096  # bytes; a settings body is a few dozen
# Read by the page's script, not by the route: documented so that the schema is complete.
DASHBOARD_INTERVAL = {
    "name": "interval",
    "in": "query",
    "required": False,
    "description": "poll period of /stats/vocab in ms (default 1000; the page ignores a bad value)",
    "schema": {"type": "integer", "minimum": 1},
}


class SettingsUpdate(BaseModel):
    """Any subset of the live settings."""

    model_config = ConfigDict(extra="forbid", strict=True)

    w_max: int | None = Field(None, ge=1)
    k_pre: int | None = Field(None, ge=0, le=64)
    k_ver: int | None = Field(None, ge=0, le=64)
    adaptive: bool | None = Field(None, description="adaptive speculation (--nanospec-adaptive)")
    adaptive_depth: int | None = Field(
        None, ge=-1, description="pin each step's draft depth (-1: the adaptive policy chooses)"
    )


def _field_errors(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in error.errors()
    )


def w_max_problem(w_max: Any, w_cap: int) -> str | None:
    """Why ``w_max`` cannot be a W_max on a server of this capacity ("w_max: ..."), or None.
    The live setting and a request's own W_max are checked by this one function."""
    try:
        SettingsUpdate.model_validate({"w_max": w_max})
    except ValidationError as error:
        return _field_errors(error)
    if w_max is not None and w_max > w_cap:
        return f"w_max: {w_max} exceeds the capacity w_cap {w_cap}"
    return None


async def _scheduler_states() -> list[dict[str, Any]]:
    """One published state per DP rank."""
    # deferred: imports SGLang only when called
    from sglang.srt.entrypoints.http_server import _global_state

    states = await _global_state.tokenizer_manager.get_internal_state()
    ranks = [state[STATE_KEY] for state in states if STATE_KEY in state]
    if not ranks:
        raise HTTPException(409, "this server runs no NanoSpec draft worker")
    return ranks


async def _push_settings(changes: dict[str, int], key_id: str) -> None:
    # deferred: imports SGLang only when called
    from sglang.srt.entrypoints.http_server import _global_state
    from sglang.srt.managers.io_struct import SetInternalStateReq

    request = SetInternalStateReq(server_args=settings_request(changes, key_id))
    updated = await _global_state.tokenizer_manager.set_internal_state(request)
    if not all(updated):
        raise HTTPException(409, "the scheduler refused the update (see the server log)")


async def _read_update(request: Request) -> SettingsUpdate:
    body = await request.body()
    if len(body) > MAX_SETTINGS_BODY:
        raise HTTPException(413, f"body: larger than {MAX_SETTINGS_BODY} bytes")
    try:
        return SettingsUpdate.model_validate_json(body or b"{}")
    except ValidationError as error:
        # SGLang's app answers every invalid request with 400 and a message; so do we.
        raise HTTPException(400, _field_errors(error)) from error


def build_router() -> APIRouter:
    router = APIRouter(tags=["nanospec"])

    @router.get(f"{ROUTE_PREFIX}/config")
    def launch_config() -> NanoSpecConfig:
        """The NanoSpec settings this server was launched with."""
        return NanoSpecConfig.from_env()

    @router.get(f"{ROUTE_PREFIX}/settings")
    async def live_settings() -> NanoSpecConfig:
        """The settings in force now (after any live change)."""
        return NanoSpecConfig.model_validate((await _scheduler_states())[0]["config"])

    @router.post(
        f"{ROUTE_PREFIX}/settings",
        openapi_extra={
            "requestBody": {
                "content": {"application/json": {"schema": SettingsUpdate.model_json_schema()}}
            }
        },
    )
    async def change_settings(
        request: Request, key_id: Annotated[str, Depends(require_admin)]
    ) -> NanoSpecConfig:
        """Change W_max / K_pre / K_ver / adaptive / adaptive_depth (admin key); effective at the next
        speculative step."""
        changes = (await _read_update(request)).model_dump(exclude_none=True)
        states = await _scheduler_states()
        current = NanoSpecConfig.model_validate(states[0]["config"])
        if problem := w_max_problem(changes.get("w_max"), current.w_cap):
            raise HTTPException(400, problem)
        if problem := live_change_problem(changes, states[0].get("adaptive")):
            raise HTTPException(400, problem)
        if changes:
            await _push_settings(changes, key_id)
        return NanoSpecConfig.model_validate((await _scheduler_states())[0]["config"])

    @router.get("/stats/vocab")
    async def stats(
        state: RequestState | None = None,
        limit: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    ) -> VocabStats:
        """Aggregates since start, running requests and recently finished ones (no text)."""
        return vocab_stats(await _scheduler_states(), state, limit)

    @router.get("/stats/vocab/{rid}")
    async def request_stats(rid: str) -> RequestEntry:
        """One request's figures, running or recently finished."""
        for entry in vocab_stats(await _scheduler_states()).requests:
            if entry.rid == rid:
                return entry
        raise HTTPException(404, f"rid: no running or recently finished request {rid!r}")

    @router.get(
        "/dashboard",
        response_class=HTMLResponse,
        responses={200: {"content": {"text/html": {}}}},
        openapi_extra={"parameters": [DASHBOARD_INTERVAL]},
    )
    def dashboard() -> FileResponse:
        """The dashboard page; it polls `/stats/vocab` itself."""
        return FileResponse(STATIC_DIR / "dashboard.html")

    return router


def install_routes(app: FastAPI) -> None:
    if any(getattr(route, "path", "").startswith(ROUTE_PREFIX) for route in app.routes):
        return  # plugins may load twice in one process
    app.include_router(build_router())
    app.mount(f"{ROUTE_PREFIX}/static", StaticFiles(directory=STATIC_DIR), name="nanospec-static")
