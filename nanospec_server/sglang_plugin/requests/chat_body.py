"""A 400 for `/v1/chat/completions` bodies that SGLang 0.5.23's request model fails on.

`ChatCompletionRequest`'s `mode="before"` validators read the raw body with `.get()`:
a body that is no JSON object (`[]`, `5`, `null`), a `response_format` that is no object,
or a `json_schema` response format whose `schema` (or its `properties.strict`) is no
object raise AttributeError. That is no ValueError, so pydantic does not turn it into a
validation error and the client gets a bare 500 (found by the API fuzzer,
`tests/serving/test_api_fuzz.py`). The validators are bound into the model's compiled
schema when SGLang's module is imported, so no hook can reach them; this ASGI middleware
checks those shapes first and answers as SGLang answers a bad request. Everything else
(including malformed JSON, which SGLang already refuses with a 400) passes through.

The same middleware bounds `n` (parallel samples) on `/generate`, `/v1/completions` and
`/v1/chat/completions`: SGLang copies a request's lists `n` times in the HTTP process before
anything checks it, so one body with a huge `n` would take the server down with it.
"""

from __future__ import annotations

from typing import Any

import orjson

CHAT_PATH = "/v1/chat/completions"
CHECKED_PATHS = frozenset({CHAT_PATH, "/v1/completions", "/generate"})
MAX_PARALLEL_SAMPLES = 128  # OpenAI's own bound on `n`
# Bodies larger than this pass unchecked (multimodal requests carry megabytes of images);
# buffering them here would come before SGLang's own body-size limit.
MAX_CHECKED_BODY = 1 << 20


def body_problem(path: str, body: bytes) -> str | None:
    """What makes SGLang fail on `body` posted to `path` (one of CHECKED_PATHS), or None."""
    try:
        request = orjson.loads(body)  # SGLang's parser, so both read the same body
    except orjson.JSONDecodeError:
        return None  # SGLang's own JSON error, a 400 already
    if path == CHAT_PATH and not isinstance(request, dict):
        return f"body: must be a JSON object, not {_json_type(request)}"
    if not isinstance(request, dict):
        return None  # SGLang's request models refuse it with a 400
    if problem := parallel_samples_problem(path, request):
        return problem
    return chat_body_problem(request) if path == CHAT_PATH else None


def parallel_samples_problem(path: str, request: dict) -> str | None:
    """A 400 for an `n` above MAX_PARALLEL_SAMPLES, where SGLang reads it."""
    if path == "/generate":
        params = request.get("sampling_params")
        found = [("sampling_params.n", p.get("n")) for p in _as_list(params) if isinstance(p, dict)]
    else:
        found = [("n", request.get("n"))]
    for field, n in found:
        if isinstance(n, int) and not isinstance(n, bool) and n > MAX_PARALLEL_SAMPLES:
            return f"{field}: at most {MAX_PARALLEL_SAMPLES} parallel samples, not {n}"
    return None


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def chat_body_problem(request: dict) -> str | None:
    """What makes SGLang's chat request model crash on this JSON object, or None."""
    response_format = request.get("response_format")
    if not response_format:
        return None
    if not isinstance(response_format, dict):
        return "response_format: must be an object"
    schema = response_format.get("schema")
    if response_format.get("type") != "json_schema" or not schema:
        return None
    if not isinstance(schema, dict):
        return "response_format.schema: must be an object"
    properties = schema.get("properties")
    strict = properties.get("strict") if isinstance(properties, dict) else None
    if strict and not isinstance(strict, dict):
        return "response_format.schema.properties.strict: must be an object"
    return None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {list: "an array", str: "a string"}.get(type(value), "a number")


class ChatBodyCheck:
    """ASGI middleware: refuse the bodies `body_problem` names, replay the others."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or scope["method"] != "POST" or path not in CHECKED_PATHS:
            await self.app(scope, receive, send)
            return
        chunks: list[dict] = []
        size = 0
        while size <= MAX_CHECKED_BODY:
            message = await receive()
            chunks.append(message)
            size += len(message.get("body", b""))
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        complete = chunks[-1]["type"] == "http.request" and not chunks[-1].get("more_body")
        if complete and size <= MAX_CHECKED_BODY:
            body = b"".join(chunk.get("body", b"") for chunk in chunks)
            if problem := body_problem(path, body):
                await _bad_request(send, problem, openai=path != "/generate")
                return
        await self.app(scope, _replaying(chunks, receive), send)


def _replaying(chunks: list[dict], receive: Any) -> Any:
    """A `receive` that hands out the buffered messages first, then the client's."""
    pending = list(chunks)

    async def replay() -> dict:
        return pending.pop(0) if pending else await receive()

    return replay


async def _bad_request(send: Any, message: str, openai: bool) -> None:
    # The shapes of SGLang's own errors: its OpenAI routes', and /generate's.
    if openai:
        error = {"object": "error", "message": message, "type": "BadRequestError", "param": None}
        payload = orjson.dumps(error | {"code": 400})
    else:
        payload = orjson.dumps({"error": {"message": message}})
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    await send({"type": "http.response.start", "status": 400, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
