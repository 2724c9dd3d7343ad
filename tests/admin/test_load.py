"""50 concurrent greedy requests while W_max changes 20 times, some with a W_max of their own:
lossless, the own W_max holds, and the books balance."""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from nanospec_server.launch.server import generate, running_server
from nanospec_server.models.tiny import tiny_model_path
from tests.admin.conftest import ADMIN, Server
from tests.serving.conftest import BASE_FLAGS, MAX_NEW_TOKENS, generate_all, make_prompts

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

PROMPTS = make_prompts(count=50, seed=11, max_len=120)
CHANGES = 20
W_MAX_VALUES = [8, 3072, 32, 512, 1, 2048, 64]
# Every third request asks for its own W_max (custom_params), which live changes leave alone.
OWN_W_MAX = {i: [2, 16, 100, 3072][i % 4] for i in range(0, len(PROMPTS), 3)}


def plain_outputs(tmp_path: Path) -> list[list[int]]:
    flags = ["--model-path", str(tiny_model_path("tiny-target")), *BASE_FLAGS]
    with running_server(flags, tmp_path / "plain.log") as url:
        # A server that does not speculate has no window: an own W_max is refused.
        refused = requests.post(
            f"{url}/generate",
            json={"input_ids": PROMPTS[0], "sampling_params": {"custom_params": {"w_max": 8}}},
            timeout=60,
        )
        assert refused.status_code == 400 and "custom_params.w_max" in refused.text
        return [r["output_ids"] for r in generate_all(url, PROMPTS)]


def generate_mixed(url: str) -> list[dict]:
    """All prompts at once, those of OWN_W_MAX with their own W_max."""

    def one(i: int) -> dict:
        own = {"custom_params": {"w_max": OWN_W_MAX[i]}} if i in OWN_W_MAX else {}
        return generate(url, PROMPTS[i], MAX_NEW_TOKENS, **own)

    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        return list(pool.map(one, range(len(PROMPTS))))


def change_w_max(server: Server, stop: threading.Event, applied: list[int]) -> None:
    for w_max in itertools.islice(itertools.cycle(W_MAX_VALUES), CHANGES):
        response = server.settings(ADMIN, w_max=w_max)
        assert response.status_code == 200, response.text
        applied.append(response.json()["w_max"])
        if not stop.is_set():
            time.sleep(0.2)  # spread the changes over the batch while it runs


def test_live_changes_under_load_are_lossless(server: Server, tmp_path: Path) -> None:
    expected = plain_outputs(tmp_path)
    stats_before = server.stats()
    before = stats_before["aggregates"]
    stop, applied = threading.Event(), []
    changer = threading.Thread(target=change_w_max, args=(server, stop, applied))
    changer.start()
    try:
        results = generate_mixed(server.url)
    finally:
        stop.set()
        changer.join()
        # the server is shared by tests/admin: leave the live W_max as it was found
        server.settings(ADMIN, w_max=stats_before["settings"]["w_max"])
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
    for i, result in enumerate(results):
        entry, meta = latest[result["meta_info"]["id"]], result["meta_info"]["nanospec"][-1]
        assert entry["draft_steps"] == meta["draft_steps"]
        if i in OWN_W_MAX:
            assert entry["w_max"] == meta["w_max"] == OWN_W_MAX[i]
            assert meta["active_vocab_max"] <= OWN_W_MAX[i] + 1  # + the pinned EOS
        else:
            assert entry["w_max"] in W_MAX_VALUES
    # no request left behind in SGLang's scheduler either
    running = running_gauge(server)
    assert running and all(float(line.rsplit(" ", 1)[1]) == 0 for line in running), running


def running_gauge(server: Server, timeout_s: float = 30) -> list[str]:
    """SGLang's `num_running_reqs` lines once they read 0 (or at the deadline). The
    scheduler publishes the idle value on its first idle loop, which can come after the
    last response reached us: read once, the gauge may still hold the last batch's count."""
    deadline = time.monotonic() + timeout_s
    while True:
        metrics = requests.get(f"{server.url}/metrics", timeout=30).text
        lines = [
            line for line in metrics.splitlines() if line.startswith("sglang:num_running_reqs")
        ]
        idle = lines and all(float(line.rsplit(" ", 1)[1]) == 0 for line in lines)
        if idle or time.monotonic() > deadline:
            return lines
        time.sleep(0.5)
