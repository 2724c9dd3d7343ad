"""`/generate` clients that end every way a client can: answered whole, streamed to the
end, streamed then gone mid-answer, or cut short through `/abort_request`."""

from __future__ import annotations

import json
from dataclasses import dataclass

import requests

from nanospec_server.launch.server import REQUEST_TIMEOUT_S, checked

LEFT = "left"  # the finish of a stream whose client went away before its end


class StreamError(RuntimeError):
    pass


@dataclass
class Outcome:
    rid: str | None
    output_ids: list[int]  # all of them, or what the client saw before it left
    finish: str  # SGLang's finish_reason type ("length", "stop", "abort"), or LEFT


def _body(rid: str | None, input_ids: list[int], params: dict, stream: bool) -> dict:
    return {"rid": rid, "input_ids": input_ids, "sampling_params": params, "stream": stream}


def generate_whole(url: str, rid: str | None, input_ids: list[int], params: dict) -> Outcome:
    body = _body(rid, input_ids, params, stream=False)
    response = checked(requests.post(f"{url}/generate", json=body, timeout=REQUEST_TIMEOUT_S))
    result = response.json()
    return Outcome(rid, result["output_ids"], result["meta_info"]["finish_reason"]["type"])


def stream(
    url: str, rid: str, input_ids: list[int], params: dict, leave_after: int | None = None
) -> Outcome:
    """Stream the answer; with `leave_after`, close the connection after that many chunks
    (SGLang then aborts the request). Each chunk carries every output id so far."""
    body = _body(rid, input_ids, params, stream=True)
    response = requests.post(f"{url}/generate", json=body, stream=True, timeout=REQUEST_TIMEOUT_S)
    with checked(response):
        output_ids, chunks = [], 0
        for line in response.iter_lines():
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[len(b"data:") :])
            if "error" in chunk:  # SGLang reports a failure mid-stream as a chunk
                raise StreamError(f"{rid}: {chunk['error']}")
            output_ids, chunks = chunk["output_ids"], chunks + 1
            finish = chunk["meta_info"]["finish_reason"]
            if finish is not None:
                return Outcome(rid, output_ids, finish["type"])
            if leave_after is not None and chunks >= leave_after:
                return Outcome(rid, output_ids, LEFT)  # leaving `with` closes the socket
    raise requests.ConnectionError(f"{rid}: the stream ended without a finish reason")


def abort(url: str, rid: str, headers: dict[str, str]) -> None:
    """`/abort_request` (it takes the admin key when the server has one)."""
    response = requests.post(f"{url}/abort_request", json={"rid": rid}, headers=headers, timeout=60)
    checked(response)
