"""The request-body middleware: a 400 for the shapes SGLang's chat request model crashes on
and for an `n` past the bound, the body replayed untouched for everything else."""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from nanospec_server.sglang_plugin.requests.chat_body import (
    CHAT_PATH,
    MAX_CHECKED_BODY,
    MAX_PARALLEL_SAMPLES,
    ChatBodyCheck,
    body_problem,
)


def chat(**fields) -> str:
    return json.dumps({"messages": [{"role": "user", "content": "hi"}], **fields})


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"received": (await request.body()).decode()})


@pytest.fixture(scope="module")
def client() -> TestClient:
    paths = (CHAT_PATH, "/v1/completions", "/generate", "/v1/embeddings")
    routes = [Route(path, echo, methods=["POST"]) for path in paths]
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
    assert body_problem(CHAT_PATH, body.encode()).startswith(f"{field}: ")
    response = client.post(CHAT_PATH, content=body)
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
    assert body_problem(CHAT_PATH, body.encode()) is None
    response = client.post(CHAT_PATH, content=body)
    assert response.status_code == 200 and response.json() == {"received": body}


too_many = MAX_PARALLEL_SAMPLES + 1


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/generate", {"text": "a", "sampling_params": {"n": 800797}}, "sampling_params.n"),
        ("/generate", {"text": ["a"], "sampling_params": [{"n": too_many}]}, "sampling_params.n"),
        ("/v1/completions", {"prompt": "a", "n": too_many}, "n"),
        (CHAT_PATH, json.loads(chat(n=too_many)), "n"),
    ],
)
def test_more_parallel_samples_than_the_bound_are_a_400_naming_the_field(
    client: TestClient, path: str, body: dict, field: str
) -> None:
    response = client.post(path, json=body)
    assert response.status_code == 400
    error = response.json()
    message = error["message"] if path != "/generate" else error["error"]["message"]
    assert message.startswith(f"{field}: at most {MAX_PARALLEL_SAMPLES} ")


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/generate", {"text": "a", "sampling_params": {"n": MAX_PARALLEL_SAMPLES}}),
        ("/generate", {"text": "a", "sampling_params": {"n": "many"}}),  # SGLang's own 400
        ("/generate", {"text": "a", "sampling_params": None}),
        ("/v1/completions", {"prompt": "a", "n": 2}),
        ("/v1/completions", [1]),
    ],
)
def test_parallel_samples_within_the_bound_pass(client: TestClient, path: str, body) -> None:
    content = json.dumps(body)
    assert body_problem(path, content.encode()) is None
    assert client.post(path, content=content).json() == {"received": content}


def test_other_routes_and_large_bodies_are_not_checked(client: TestClient) -> None:
    assert client.post("/v1/embeddings", content="[]").json() == {"received": "[]"}
    large = "[" + " " * MAX_CHECKED_BODY + "]"
    assert client.post(CHAT_PATH, content=large).json() == {"received": large}
