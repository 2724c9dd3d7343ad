"""HTTP routes nanospec-server adds to SGLang's FastAPI app."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI

from nanospec_server.config import NanoSpecConfig

ROUTE_PREFIX = "/nanospec"


def build_router() -> APIRouter:
    router = APIRouter(prefix=ROUTE_PREFIX, tags=["nanospec"])

    @router.get("/config")
    def launch_config() -> NanoSpecConfig:
        """The NanoSpec settings this server was launched with."""
        return NanoSpecConfig.from_env()

    return router


def install_routes(app: FastAPI) -> None:
    if any(getattr(route, "path", "").startswith(ROUTE_PREFIX) for route in app.routes):
        return  # plugins may load twice in one process
    app.include_router(build_router())
