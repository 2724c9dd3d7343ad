"""50 concurrent greedy requests while W_max changes 20 times: lossless, and the books balance."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest
import requests

from nanospec_server.bench.server import running_server
from nanospec_server.models.tiny import tiny_model_path
from tests.admin.conftest import ADMIN, Server
from tests.serving.conftest import BASE_FLAGS, generate_all, make_prompts

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

PROMPTS = make_prompts(count=50, seed=11, max_len=120)
CHANGES = 20
W_MAX_VALUES = [8, 3072, 32, 512, 1, 2048, 64]


def plain_outputs(tmp_path: Path) -> list[list[int]]:
    flags = ["--model-path", str(tiny_model_path("tiny-target")), *BASE_FLAGS]
    with running_server(flags, tmp_path / "plain.log") as url:
        return [r["output_ids"] for r in generate_all(url, PROMPTS)]


def change_w_max(server: Server, stop: threading.Event, applied: list[int]) -> None:
    for w_max in itertools.islice(itertools.cycle(W_MAX_VALUES), CHANGES):
        response = server.settings(ADMIN, w_max=w_max)
        assert response.status_code == 200, response.text
        applied.append(response.json()["w_max"])
        if not stop.is_set():
            time.sleep(0.2)  # spread the changes over the batch while it runs


def test_live_changes_under_load_are_lossless(server: Server, tmp_path: Path) -> None:
    expected = plain_outputs(tmp_path)
    before = server.stats()["aggregates"]
    stop, applied = threading.Event(), []
    changer = threading.Thread(target=change_w_max, args=(server, stop, applied))
    changer.start()
    results = generate_all(server.url, PROMPTS)
    stop.set()
    changer.join()
    assert applied == list(itertools.islice(itertools.cycle(W_MAX_VALUES), CHANGES))

    for prompt, want, got in zip(PROMPTS, expected, results, strict=True):
        assert got["output_ids"] == want, f"prompt of length {len(prompt)} diverged"
    # every request ran speculatively, under some W_max of the cycle
    assert {r["meta_info"]["nanospec"][-1]["mode"] for r in results} == {"nanospec"}

    after = server.stats(limit=len(PROMPTS))
    agg = after["aggregates"]
    assert after["requests"][0]["state"] == "finished"  # the running list is empty
    assert agg["requests_running"] == 0
    assert agg["requests_finished"] - before["requests_finished"] == len(PROMPTS)
    assert agg["prompt_tokens"] - before["prompt_tokens"] == sum(len(p) for p in PROMPTS)
    assert agg["output_tokens"] - before["output_tokens"] == sum(
        len(r["output_ids"]) for r in results
    )
    latest = {e["rid"]: e for e in after["requests"]}
    for result in results:
        entry = latest[result["meta_info"]["id"]]
        assert entry["draft_steps"] == result["meta_info"]["nanospec"][-1]["draft_steps"]
        assert entry["w_max"] in W_MAX_VALUES
    # no request left behind in SGLang's scheduler either
    metrics = requests.get(f"{server.url}/metrics", timeout=30).text
    running = [line for line in metrics.splitlines() if line.startswith("sglang:num_running_reqs")]
    assert running and all(float(line.rsplit(" ", 1)[1]) == 0 for line in running), running
