"""The chat-body middleware: a 400 for the shapes SGLang's chat request model crashes on,
the body replayed untouched for everything else."""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from nanospec_server.sglang_plugin.requests.chat_body import (
    CHECKED_PATH,
    MAX_CHECKED_BODY,
    ChatBodyCheck,
    chat_body_problem,
)


def chat(**fields) -> str:
    return json.dumps({"messages": [{"role": "user", "content": "hi"}], **fields})


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"received": (await request.body()).decode()})


@pytest.fixture(scope="module")
def client() -> TestClient:
    routes = [Route(path, echo, methods=["POST"]) for path in (CHECKED_PATH, "/v1/completions")]
    app = Starlette(routes=routes)
    app.add_middleware(ChatBodyCheck)
    return TestClient(app)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("[]", "body"),
        ("5", "body"),
        ("null", "body"),
        ('"text"', "body"),
        (chat(response_format=-6355), "response_format"),
        (chat(response_format=[1]), "response_format"),
        ('{"response_format": {"type": "json_schema", "schema": "x"}}', "response_format.schema"),
        (
            '{"response_format": {"type": "json_schema", "schema": {"properties": {"strict": 5}}}}',
            "response_format.schema.properties.strict",
        ),
    ],
)
def test_bodies_sglang_crashes_on_are_a_400_naming_the_field(
    client: TestClient, body: str, field: str
) -> None:
    assert chat_body_problem(body.encode()).startswith(f"{field}: ")
    response = client.post(CHECKED_PATH, content=body)
    assert response.status_code == 400
    error = response.json()
    assert error["object"] == "error" and error["code"] == 400
    assert error["message"].startswith(f"{field}: ")


@pytest.mark.parametrize(
    "body",
    [
        chat(),
        chat(response_format={"type": "json_object"}),
        chat(response_format=[]),  # falsy: SGLang skips it, then refuses it
        '{"response_format": {"type": "json_schema", "schema": {"properties": [1]}}}',
        '{"response_format": {"type": "json_schema", "schema": {"type": "object"}}}',
        "{not json",  # SGLang's own 400
        "",
    ],
)
def test_other_bodies_reach_the_route_unchanged(client: TestClient, body: str) -> None:
    assert chat_body_problem(body.encode()) is None
    response = client.post(CHECKED_PATH, content=body)
    assert response.status_code == 200 and response.json() == {"received": body}


def test_other_routes_and_large_bodies_are_not_checked(client: TestClient) -> None:
    assert client.post("/v1/completions", content="[]").json() == {"received": "[]"}
    large = "[" + " " * MAX_CHECKED_BODY + "]"
    assert client.post(CHECKED_PATH, content=large).json() == {"received": large}
