"""Contract of every route the admin layer adds, against a real server: auth, bad input, stats."""

from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from nanospec_server.launch.server import generate
from tests.admin.conftest import ADMIN, Server
from tests.serving.conftest import ADMIN_KEY
from tests.surface import RECORDED, comparable_schema

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]


def test_launch_and_live_settings(server: Server) -> None:
    launched = requests.get(f"{server.url}/nanospec/config", timeout=30).json()
    expected = {"mode": "nanospec", "w_max": 3072, "w_cap": 3072, "k_pre": 3, "k_ver": 3}
    assert {key: launched[key] for key in expected} == expected
    live = requests.get(f"{server.url}/nanospec/settings", timeout=30).json()
    assert live["w_cap"] == 3072


def test_settings_change_needs_the_admin_key(server: Server) -> None:
    before = requests.get(f"{server.url}/nanospec/settings", timeout=30).json()["w_max"]
    assert server.settings(None, w_max=100).status_code == 401
    assert server.settings({"Authorization": "Bearer wrong"}, w_max=100).status_code == 403
    assert server.settings({"X-Admin-Key": "wrong"}, w_max=100).status_code == 403
    assert requests.get(f"{server.url}/nanospec/settings", timeout=30).json()["w_max"] == before
    bearer = {"Authorization": f"Bearer {ADMIN_KEY}"}
    assert server.settings(bearer, w_max=before - 1).json()["w_max"] == before - 1
    assert server.settings(ADMIN, w_max=before).json()["w_max"] == before
    log = server.log.read_text()
    assert f"w_max {before} -> {before - 1}" in log and "settings changed by admin key" in log
    assert f"admin key {ADMIN_KEY}" not in log


def test_the_internal_state_route_is_no_way_around_the_key(server: Server) -> None:
    before = requests.get(f"{server.url}/nanospec/settings", timeout=30).json()["w_max"]
    forged = {"nanospec_settings": {"changes": {"w_max": 7}, "key_id": "x", "token": "guess"}}
    for body in (forged, {"nanospec_w_max": 7}):
        response = requests.post(
            f"{server.url}/set_internal_state",
            json={"server_args": body},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=30,
        )
        assert response.status_code >= 400 or response.json() == [False], response.text
    assert requests.get(f"{server.url}/nanospec/settings", timeout=30).json()["w_max"] == before


BAD_BODIES = [
    ('{"w_max": "2048"}', "w_max"),  # wrong type
    ('{"w_max": 2.5}', "w_max"),
    ('{"w_max": 0}', "w_max"),  # out of range
    ('{"w_max": 999999}', "w_max"),  # beyond the capacity
    ('{"k_ver": 65}', "k_ver"),
    ('{"w_min": 3}', "w_min"),  # unknown field
    ('{"w_max": 20', "body"),  # malformed JSON
    ("[1, 2]", "body"),
    ('{"w_max": 1, "pad": "' + "x" * 8000 + '"}', "body"),  # oversized
]


@pytest.mark.parametrize(("body", "named"), BAD_BODIES)
def test_bad_bodies_are_4xx_naming_the_field(server: Server, body: str, named: str) -> None:
    headers = ADMIN | {"Content-Type": "application/json"}
    response = requests.post(
        f"{server.url}/nanospec/settings", data=body, headers=headers, timeout=30
    )
    assert 400 <= response.status_code < 500 and named in response.text, response.text


def test_bad_queries_are_4xx_naming_the_parameter(server: Server) -> None:
    for params, named in [({"state": "bogus"}, "state"), ({"limit": 0}, "limit")]:
        response = requests.get(f"{server.url}/stats/vocab", params=params, timeout=30)
        assert response.status_code == 400 and named in response.text, response.text
    missing = requests.get(f"{server.url}/stats/vocab/no-such-request", timeout=30)
    assert missing.status_code == 404 and "no-such-request" in missing.text
    # and the server still serves
    assert generate(server.url, [1, 5, 6], 4)["meta_info"]["completion_tokens"] == 4


def test_running_request_is_listed_then_finished(server: Server) -> None:
    rid = "admin-test-long"
    body = {"rid": rid, "text": "zebra marker text", "sampling_params": {
        "max_new_tokens": 200, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    done = {}
    thread = threading.Thread(
        target=lambda: done.update(
            requests.post(f"{server.url}/generate", json=body, timeout=300).json()
        )
    )
    thread.start()
    entry = None
    deadline = time.monotonic() + 120
    while entry is None and time.monotonic() < deadline:
        running = server.stats(state="running")["requests"]
        entry = next((e for e in running if e["rid"] == rid and e["draft_steps"] > 0), None)
    assert entry is not None, "the running request never showed up"
    assert entry["state"] == "running" and entry["finished_at"] is None
    assert entry["prompt_tokens"] > 0 and 0 < entry["output_tokens"] < 200
    live = requests.get(f"{server.url}/nanospec/settings", timeout=30).json()["w_max"]
    assert entry["w_max"] == live and 0 < entry["active_vocab_size"] <= entry["active_vocab_max"]
    one = requests.get(f"{server.url}/stats/vocab/{rid}", timeout=30).json()
    assert one["rid"] == rid
    thread.join()
    final = requests.get(f"{server.url}/stats/vocab/{rid}", timeout=30).json()
    assert final["state"] == "finished" and final["output_tokens"] == 200
    meta = done["meta_info"]["nanospec"][-1]
    assert final["draft_steps"] == meta["draft_steps"]
    assert final["active_vocab_mean"] == meta["active_vocab_mean"]
    stats_text = requests.get(f"{server.url}/stats/vocab", timeout=30).text
    assert "zebra" not in stats_text and done["text"][:20] not in stats_text  # never any text
    stats = requests.get(f"{server.url}/stats/vocab", timeout=30).json()
    memory = stats["ranks"][0]["memory"]
    assert memory["total_bytes"] == stats["aggregates"]["state_bytes"] > 0
    assert memory["window_bytes"] + memory["union_bytes"] <= memory["total_bytes"]
    assert memory["tokens_not_admitted"] == 0  # the tiny vocabulary always fits
    limited = server.stats(limit=1, state="finished")["requests"]
    assert len(limited) == 1 and limited[0]["state"] == "finished"


def test_served_schema_is_unchanged(server: Server) -> None:
    served = comparable_schema(requests.get(f"{server.url}/openapi.json", timeout=30).json())
    recorded = json.loads((RECORDED / "openapi.json").read_text())
    assert served == recorded, "the served API changed; if on purpose: python -m tests.surface"


def test_schema_metrics_and_dashboard_are_served(server: Server) -> None:
    generate(server.url, [1, 9, 10, 11], 8)
    schema = requests.get(f"{server.url}/openapi.json", timeout=30).json()
    assert "VocabStats" in schema["components"]["schemas"]
    ours = {"/stats/vocab", "/stats/vocab/{rid}", "/nanospec/settings", "/nanospec/config"}
    assert ours | {"/dashboard"} <= set(schema["paths"])  # the fuzzer reaches all of them
    assert "text/html" in schema["paths"]["/dashboard"]["get"]["responses"]["200"]["content"]
    metrics = requests.get(f"{server.url}/metrics", timeout=30).text
    for series in ("nanospec:active_vocab_size_count", "nanospec:coverage_bucket",
                   "nanospec:accept_length_sum", "nanospec:lm_head_rows_computed_total",
                   "nanospec:lm_head_rows_saved_total", "nanospec:w_max",
                   "nanospec:settings_changes_total", "sglang:"):  # fmt: skip
        assert series in metrics, series
    page = requests.get(f"{server.url}/dashboard", timeout=30)
    assert page.status_code == 200 and "dashboard.js" in page.text
    script = requests.get(f"{server.url}/nanospec/static/dashboard.js", timeout=30)
    assert script.status_code == 200 and "/stats/vocab" in script.text


def streamed_nanospec(server: Server, custom_params: dict | None) -> list[list[dict]]:
    """`meta_info["nanospec"]` of each chunk of one streamed greedy request."""
    params = {"temperature": 0.0, "max_new_tokens": 24, "ignore_eos": True}
    if custom_params is not None:
        params["custom_params"] = custom_params
    body = {"text": "streamed statistics", "sampling_params": params, "stream": True}
    chunks = []
    with requests.post(f"{server.url}/generate", json=body, stream=True, timeout=300) as reply:
        assert reply.status_code == 200, reply.text
        for line in reply.iter_lines():
            if line.startswith(b"data: {"):
                chunks.append(json.loads(line[len(b"data: ") :])["meta_info"]["nanospec"])
    return chunks


def test_a_streamed_reply_carries_its_statistics_on_its_last_chunk(server: Server) -> None:
    quiet = streamed_nanospec(server, None)
    assert len(quiet) > 2 and all(chunk == [] for chunk in quiet[:-1]), quiet
    # every token but the prefill's came from a decode step
    assert len(quiet[-1]) == 1 and quiet[-1][0]["emitted_tokens"] == 24 - 1, quiet[-1]
    every = streamed_nanospec(server, {"nanospec_stats_every_chunk": True})
    assert [len(chunk) for chunk in every] == list(range(1, len(every) + 1))
    emitted = [chunk[-1]["emitted_tokens"] for chunk in every]
    assert emitted == sorted(emitted) and emitted[0] < emitted[-1]
    assert every[-1][-1]["draft_steps"] + every[-1][-1]["plain_steps"] > 0
    body = {"text": "x", "sampling_params": {"custom_params": {"nanospec_stats_every_chunk": 1}}}
    refused = requests.post(f"{server.url}/generate", json=body, timeout=60)
    assert refused.status_code == 400 and "nanospec_stats_every_chunk" in refused.text
