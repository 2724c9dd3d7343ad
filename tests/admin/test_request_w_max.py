"""A request's own W_max (`custom_params.w_max`) against a real server: in force for the
request's whole life over live changes, visible in its statistics, bounding its active
vocabulary, checked like the live setting."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from nanospec_server.launch.server import generate
from tests.admin.conftest import ADMIN, Server
from tests.serving.conftest import make_prompts

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

W_CAP = 3072  # the admin server's launch capacity
EOS_PINNED = 1  # the tiny models' EOS, active in every set
PROMPT = make_prompts(count=4, seed=23, max_len=80)[-1]  # 81 tokens, many distinct


def generate_own(
    url: str, prompt: list[int], max_new: int, w_max, rid: str | None = None, **sampling
) -> requests.Response:
    params = {"temperature": 0.0, "max_new_tokens": max_new, **sampling}
    params["custom_params"] = {"w_max": w_max}
    body = {"input_ids": prompt, "sampling_params": params} | ({"rid": rid} if rid else {})
    return requests.post(f"{url}/generate", json=body, timeout=300)


def live_w_max(server: Server) -> int:
    return requests.get(f"{server.url}/nanospec/settings", timeout=30).json()["w_max"]


def entry(server: Server, rid: str) -> dict:
    response = requests.get(f"{server.url}/stats/vocab/{rid}", timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def test_own_w_max_is_in_force_and_bounds_the_active_vocabulary(server: Server) -> None:
    assert live_w_max(server) > 100  # the plain request's window holds the whole prompt
    plain = generate(server.url, PROMPT, 16)
    response = generate_own(server.url, PROMPT, 16, 8, rid="own-w-max-8")
    assert response.status_code == 200, response.text
    own = response.json()
    assert own["output_ids"] == plain["output_ids"]  # the target verifies every token
    meta = own["meta_info"]["nanospec"][-1]
    assert meta["w_max"] == 8 and meta["active_vocab_max"] <= 8 + EOS_PINNED
    assert plain["meta_info"]["nanospec"][-1]["active_vocab_max"] > 8 + EOS_PINNED
    assert plain["meta_info"]["nanospec"][-1]["w_max"] == live_w_max(server)
    finished = entry(server, "own-w-max-8")
    assert finished["state"] == "finished" and finished["w_max"] == 8
    assert finished["active_vocab_max"] <= 8 + EOS_PINNED


def test_own_w_max_holds_over_a_live_change_that_reaches_the_others(server: Server) -> None:
    before = live_w_max(server)
    rid = "own-w-max-long"
    done: dict = {}
    long_request = threading.Thread(
        target=lambda: done.update(
            generate_own(server.url, PROMPT, 300, 16, rid=rid, ignore_eos=True).json()
        )
    )
    long_request.start()
    try:
        running = wait_running(server, rid)
        assert running["w_max"] == 16 and running["active_vocab_size"] <= 16 + EOS_PINNED
        assert server.settings(ADMIN, w_max=4).json()["w_max"] == 4
        other = generate(server.url, PROMPT, 8)["meta_info"]["nanospec"][-1]
        assert other["w_max"] == 4 and other["active_vocab_max"] <= 4 + EOS_PINNED
        still = entry(server, rid)
        assert still["w_max"] == 16, still
    finally:
        assert server.settings(ADMIN, w_max=before).status_code == 200
        long_request.join()
    meta = done["meta_info"]["nanospec"][-1]
    assert meta["w_max"] == 16 and meta["active_vocab_max"] <= 16 + EOS_PINNED
    assert done["output_ids"] == generate(server.url, PROMPT, 300, ignore_eos=True)["output_ids"]


def wait_running(server: Server, rid: str, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for found in server.stats(state="running")["requests"]:
            if found["rid"] == rid and found["draft_steps"] > 0:
                return found
        time.sleep(0.05)
    raise AssertionError(f"request {rid} never showed up running")


def test_chat_completions_take_an_own_w_max(server: Server) -> None:
    chat = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 6}
    chat |= {"temperature": 0, "rid": "own-w-max-chat", "custom_params": {"w_max": 12}}
    reply = requests.post(f"{server.url}/v1/chat/completions", json=chat, timeout=120)
    assert reply.status_code == 200, reply.text
    assert entry(server, "own-w-max-chat")["w_max"] == 12
    chat |= {"rid": "own-w-max-chat-bad", "custom_params": {"w_max": 0}}
    bad = requests.post(f"{server.url}/v1/chat/completions", json=chat, timeout=120)
    assert bad.status_code == 400 and "custom_params.w_max" in bad.text, bad.text


# Checked like the live setting: same bounds, the same messages behind the field name.
BAD_OVERRIDES = [
    ("2048", "valid integer"),
    (2.5, "valid integer"),
    (True, "valid integer"),
    ([8], "valid integer"),
    (0, "greater than or equal to 1"),
    (-3, "greater than or equal to 1"),
    (W_CAP + 1, f"exceeds the capacity w_cap {W_CAP}"),
]


def test_bad_overrides_are_400_naming_the_field_and_neighbours_are_untouched(
    server: Server,
) -> None:
    alone = generate(server.url, PROMPT, 24)["output_ids"]
    with ThreadPoolExecutor(len(BAD_OVERRIDES) + 1) as pool:
        good = pool.submit(generate_own, server.url, PROMPT, 24, 5)
        bad = pool.map(lambda case: generate_own(server.url, PROMPT, 8, case[0]), BAD_OVERRIDES)
        for (value, message), response in zip(BAD_OVERRIDES, bad, strict=True):
            assert response.status_code == 400, (value, response.text)
            assert "custom_params.w_max" in response.text and message in response.text, (
                value,
                response.text,
            )
        assert good.result().status_code == 200
        assert good.result().json()["output_ids"] == alone
    # null means "no override": the live W_max
    plain = generate_own(server.url, PROMPT, 4, None)
    assert plain.json()["meta_info"]["nanospec"][-1]["w_max"] == live_w_max(server)
