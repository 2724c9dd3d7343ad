"""Faults against a real tiny NanoSpec server (tiny target, tiny EAGLE draft): a client
that leaves mid-stream, `/abort_request`, the context limit, W_max changes racing aborts,
and a scheduler that dies. After each, nothing stays held and greedy output is plain's."""

from __future__ import annotations

import itertools
import json
import random
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests

from nanospec_server.bench import clients
from nanospec_server.engine_watch import EXIT_ENGINE_DIED
from nanospec_server.launch import server_state
from nanospec_server.launch.server import running_server_processes, speculative_flags
from nanospec_server.models.tiny import tiny_model_path
from nanospec_server.models.tiny.tokenizer import BOS_ID, VOCAB_SIZE
from tests.serving.conftest import ADMIN_KEY, BASE_FLAGS, make_prompts

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
CONTEXT = 512
STEPS, TOPK, DRAFT_TOKENS = 3, 1, 4
# SGLang keeps max(topk x steps, draft tokens) of an EAGLE request's context for its drafts.
RESERVED = max(TOPK * STEPS, DRAFT_TOKENS)
MAX_PROMPT = CONTEXT - 1 - 5 - 1  # the scheduler takes prompts below min(context - 1, KV) - 5
TARGET = ["--model-path", str(tiny_model_path("tiny-target")), *BASE_FLAGS]
TARGET += ["--context-length", str(CONTEXT)]
SPEC = speculative_flags("EAGLE", "tiny-eagle", STEPS, TOPK, DRAFT_TOKENS)
SPEC += ["--nanospec-w-max", "64", "--nanospec-w-cap", "256"]
LONG = 300  # new tokens of a request that is cut short long before it could finish
GREEDY_LONG = {"temperature": 0, "max_new_tokens": LONG, "ignore_eos": True}


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    folder = tmp_path_factory.mktemp("faults")
    servers = {
        "spec": (TARGET + SPEC, folder / "spec.log"),
        "plain": (TARGET, folder / "plain.log"),
    }
    with running_server_processes(servers) as started:
        yield {name: url for name, (url, _) in started.items()}
    # They were stopped as a user's Ctrl-C stops them (SIGINT to the process group), which
    # ends SGLang's processes on purpose: no error, status 0.
    for name, (_, process) in started.items():
        log = servers[name][1].read_text()
        assert process.returncode == 0 and "nanospec: error" not in log, log[-3000:]


def prompt(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [BOS_ID] + [rng.randrange(3, VOCAB_SIZE) for _ in range(length - 1)]


def plain_output(urls: dict[str, str], input_ids: list[int], max_new_tokens: int) -> list[int]:
    params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    return clients.generate_whole(urls["plain"], None, input_ids, params).output_ids


def aggregates(url: str) -> dict:
    return server_state.vocab_stats(url, limit=1)["aggregates"]


def assert_idle(url: str) -> server_state.Held:
    now = server_state.wait_until_idle(url)
    assert now.idle, f"still held after every request ended: {now}"
    return now


def test_a_client_that_leaves_mid_stream_is_aborted_and_frees_its_slot(urls) -> None:
    spec, input_ids = urls["spec"], prompt(60, seed=1)
    idle, before = assert_idle(spec), aggregates(spec)
    rid, seen = "fault-leaves", []
    body = {"rid": rid, "input_ids": input_ids, "stream": True, "sampling_params": GREEDY_LONG}
    with requests.post(f"{spec}/generate", json=body, stream=True, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith(b"data:"):
                seen.append(line)
            if len(seen) == 3:
                break
        holding = server_state.held(spec)  # while it runs, it holds a slot and rows
        assert holding.slots_in_use == 1 and holding.union_rows_in_use > idle.union_rows_idle
        assert holding.state_bytes_in_use > idle.state_bytes_idle
    # the connection is closed: SGLang aborts the request at its next step
    entry = server_state.wait_for_entry(spec, rid, {"finished", "aborted"})
    assert entry is not None and entry["state"] == "aborted", entry
    assert 3 <= entry["output_tokens"] < LONG
    streamed = json.loads(seen[-1][len(b"data:") :])["output_ids"]
    assert streamed == plain_output(urls, input_ids, len(streamed))  # plain decoding's start
    assert assert_idle(spec) == idle
    after = aggregates(spec)
    assert after["requests_aborted"] == before["requests_aborted"] + 1
    assert after["requests_finished"] == before["requests_finished"]
    assert after["output_tokens"] == before["output_tokens"] + entry["output_tokens"]


def test_abort_request_cuts_a_request_short_and_frees_its_slot(urls) -> None:
    spec, input_ids = urls["spec"], prompt(80, seed=2)
    idle, before = assert_idle(spec), aggregates(spec)
    rid, result = "fault-abort-route", {}
    thread = threading.Thread(
        target=lambda: result.update(
            outcome=clients.generate_whole(spec, rid, input_ids, GREEDY_LONG)
        )
    )
    thread.start()
    try:
        assert server_state.wait_until_drafting(spec, rid) is not None, "it never ran"
        clients.abort(spec, rid, ADMIN)
    finally:
        thread.join(timeout=300)
    outcome = result["outcome"]
    assert outcome.finish == "abort" and 0 < len(outcome.output_ids) < LONG
    # what it produced before the abort is plain decoding's start
    assert outcome.output_ids == plain_output(urls, input_ids, len(outcome.output_ids))
    entry = server_state.wait_for_entry(spec, rid, {"aborted"})
    assert entry is not None and entry["output_tokens"] == len(outcome.output_ids)
    assert assert_idle(spec) == idle
    assert aggregates(spec)["requests_aborted"] == before["requests_aborted"] + 1
    clients.abort(spec, "fault-no-such-request", ADMIN)  # an unknown id changes nothing
    assert aggregates(spec)["requests_aborted"] == before["requests_aborted"] + 1


def test_requests_past_the_context_are_refused_and_at_it_served(urls) -> None:
    """Two limits: the prompt (SGLang's scheduler takes fewer than context - 6 tokens) and
    prompt + reserved + new tokens (at most the context). Each is served exactly at it."""
    spec = urls["spec"]
    too_long = requests.post(
        f"{spec}/generate",
        json={"input_ids": prompt(CONTEXT, seed=3), "sampling_params": {"max_new_tokens": 1}},
        timeout=60,
    )
    assert too_long.status_code == 400, too_long.text
    assert f"longer than the model's context length ({CONTEXT} tokens)" in too_long.text
    past_prompt = refused(spec, prompt(MAX_PROMPT + 1, seed=4), new_tokens=1)
    assert f"maximum allowed length ({MAX_PROMPT + 1} tokens)" in past_prompt
    # the longest prompt, with the answer up to the last position; a long answer there too
    for length in (MAX_PROMPT, CONTEXT - RESERVED - 60):
        input_ids, new_tokens = prompt(length, seed=length), CONTEXT - RESERVED - length
        past_total = refused(spec, input_ids, new_tokens + 1)
        assert f"exceeds the model's maximum context length of {CONTEXT}" in past_total
        params = {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}
        at_limit = clients.generate_whole(spec, f"fault-at-limit-{length}", input_ids, params)
        assert at_limit.finish == "length" and len(at_limit.output_ids) == new_tokens
        assert at_limit.output_ids == plain_output(urls, input_ids, new_tokens)
    assert_idle(spec)


def refused(url: str, input_ids: list[int], new_tokens: int) -> str:
    params = {"max_new_tokens": new_tokens, "ignore_eos": True}
    body = {"input_ids": input_ids, "sampling_params": params}
    response = requests.post(f"{url}/generate", json=body, timeout=60)
    assert response.status_code == 400, response.text
    return response.text


W_MAX_CYCLE = [8, 256, 1, 64, 32, 200, 2]


def test_w_max_changes_racing_aborts(urls) -> None:
    """Streams that leave, requests aborted through the route and requests that finish,
    all at once, while W_max changes under them."""
    spec = urls["spec"]
    idle, before = assert_idle(spec), aggregates(spec)
    finishing = make_prompts(count=6, seed=5, max_len=120)
    cut = make_prompts(count=8, seed=6, max_len=120)
    expected = [plain_output(urls, p, 24) for p in finishing]
    greedy = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}
    stop, applied = threading.Event(), []

    def change_w_max() -> None:
        for w_max in itertools.islice(itertools.cycle(W_MAX_CYCLE), 40):
            if stop.is_set():
                return
            response = requests.post(
                f"{spec}/nanospec/settings", json={"w_max": w_max}, headers=ADMIN, timeout=60
            )
            applied.append(response.status_code)
            time.sleep(0.1)

    def cut_short(i: int) -> clients.Outcome:
        rid = f"fault-race-{i}"
        if i % 2:  # a stream whose client leaves after a few chunks
            return clients.stream(spec, rid, cut[i], GREEDY_LONG, leave_after=1 + i % 4)
        aborter = threading.Thread(target=abort_once_drafting, args=(spec, rid))
        aborter.start()
        try:
            return clients.generate_whole(spec, rid, cut[i], GREEDY_LONG)
        finally:
            aborter.join(timeout=300)

    changer = threading.Thread(target=change_w_max)
    changer.start()
    try:
        with ThreadPoolExecutor(max_workers=len(finishing) + len(cut)) as pool:
            done = [
                pool.submit(clients.generate_whole, spec, f"fault-ok-{i}", p, greedy)
                for i, p in enumerate(finishing)
            ]
            aborted = list(pool.map(cut_short, range(len(cut))))
            finished = [future.result() for future in done]
    finally:
        stop.set()
        changer.join(timeout=120)
        requests.post(f"{spec}/nanospec/settings", json={"w_max": 64}, headers=ADMIN, timeout=60)
    assert applied and set(applied) == {200}, applied
    assert [o.output_ids for o in finished] == expected
    assert {o.finish for o in aborted} <= {"abort", clients.LEFT}
    for outcome in aborted:
        entry = server_state.wait_for_entry(spec, outcome.rid, {"aborted", "finished"})
        assert entry is not None and entry["state"] == "aborted", entry
    assert assert_idle(spec) == idle
    after = aggregates(spec)
    assert after["requests_aborted"] - before["requests_aborted"] == len(cut)
    assert after["requests_finished"] - before["requests_finished"] == len(finishing)


def abort_once_drafting(url: str, rid: str) -> None:
    if server_state.wait_until_drafting(url, rid) is not None:
        clients.abort(url, rid, ADMIN)


def test_a_dead_scheduler_stops_the_server_with_a_message(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with running_server_processes({"server": (TARGET, log)}) as started:
        url, process = started["server"]
        scheduler = server_state.scheduler_process(url)
        engine = psutil.Process(process.pid).children(recursive=True)
        body = {"input_ids": prompt(20, seed=7), "stream": True, "sampling_params": GREEDY_LONG}
        in_flight = requests.post(f"{url}/generate", json=body, stream=True, timeout=120)
        next(in_flight.iter_lines())  # it is answering
        scheduler.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        code = process.wait(timeout=120)
        stopped_after = time.monotonic() - killed_at
        drain(in_flight)  # the answer ends with the server: it never hangs
    assert code == EXIT_ENGINE_DIED, log.read_text()[-3000:]
    assert stopped_after < 60, stopped_after  # ~1 s on an idle host
    message = f"nanospec: error: SGLang's scheduler_0 process (pid {scheduler.pid}) was killed by signal 9"
    assert message in log.read_text()
    _, alive = psutil.wait_procs(engine, timeout=60)
    assert not alive, alive  # nothing SGLang started is left
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/health", timeout=10)


def drain(response: requests.Response) -> None:
    try:
        for _ in response.iter_lines():
            pass
    except requests.RequestException:
        pass  # cut off: what a client of a dead server sees
