"""Two replicas behind SGLang's router (sglang-router), one of them with `--dp-size 2`:
requests pinned to each DP rank are counted on that rank; health checks (the router's
included) never enter the statistics; generate and chat pass through both routing policies
with the greedy output of a direct request; the fleet view adds up; a W_max change from the
CLI or the dashboard reaches every worker and rank.

One fleet serves every case: the package's server (tests/admin/conftest.py) and one
`--dp-size 2` worker started here, behind a router per policy. Each server start costs a
minute or more of the CI's two cores.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from nanospec_server.admin.fleet import FleetStats, fetch_fleet, worker_label
from nanospec_server.admin.stats_models import Aggregates
from nanospec_server.launch.server import free_port, running_servers
from nanospec_server.models.tiny import tiny_model_path
from tests.admin.conftest import ADMIN, SPEC_FLAGS, Server
from tests.admin.test_admin_cli import nanospec
from tests.admin.test_dashboard_browser import browser, submit_w_max, texts  # noqa: F401
from tests.serving.conftest import ADMIN_KEY, BASE_FLAGS

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

POLICIES = ("round_robin", "cache_aware")
ROUTER_START_S = 120
# The router probes every worker's /health (a one-token generate) this often: during the
# module, dozens of health checks run beside the test's requests, and must not be counted.
HEALTH_INTERVAL_S = "1"
PROMPTS = ["def fib(n):", "The capital of France", "for i in range(", "import numpy as"]
CHATS = ["hello there", "write a list"]


@dataclass
class Fleet:
    workers: dict[str, str]  # "dp2" (--dp-size 2) and "one" (the package's server): URL
    routers: dict[str, str]  # policy: URL

    @property
    def urls(self) -> list[str]:
        return list(self.workers.values())

    def aggregates(self) -> dict[str, Aggregates]:
        return {
            name: Aggregates.model_validate(stats(url)["aggregates"])
            for name, url in self.workers.items()
        }


def stats(url: str) -> dict:
    response = requests.get(f"{url}/stats/vocab", timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


@contextmanager
def running_router(worker_urls: list[str], policy: str, log_path: Path) -> Iterator[str]:
    port = free_port()
    command = [
        sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
        "--port", str(port), "--worker-urls", *worker_urls, "--policy", policy,
        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        "--health-check-interval-secs", HEALTH_INTERVAL_S, "--log-level", "warn",
    ]  # fmt: skip
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ROUTER_START_S
        while not _ready(url):
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, f"router not ready:\n{log_path.read_text()}"
            time.sleep(1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/readiness", timeout=5).status_code == 200
    except requests.RequestException:
        return False


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[Fleet]:
    logs = tmp_path_factory.mktemp("fleet")
    # the package server's flags (same models, so the same greedy outputs), two DP ranks
    flags = ["--model-path", str(tiny_model_path("tiny-target"))]
    flags += BASE_FLAGS + SPEC_FLAGS + ["--enable-metrics", "--dp-size", "2"]
    with ExitStack() as stack, pytest.MonkeyPatch.context() as env:
        # SGLang's CPU path binds each scheduler to a NUMA node unless told which cores each
        # rank gets; this host has one node. (With our sgl_kernel stand-in it binds nothing.)
        env.setenv("SGLANG_CPU_OMP_THREADS_BIND", "0|1")
        dp2 = stack.enter_context(running_servers({"dp2": (flags, logs / "dp2.log")}))["dp2"]
        workers = {"dp2": dp2, "one": server.url}
        routers = {
            policy: stack.enter_context(
                running_router(list(workers.values()), policy, logs / f"router-{policy}.log")
            )
            for policy in POLICIES
        }
        yield Fleet(workers, routers)


def generate(url: str, text: str, rid: str | None = None, **extra) -> dict:
    body = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": 12}}
    body |= ({"rid": rid} if rid else {}) | extra
    response = requests.post(f"{url}/generate", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()


def chat(url: str, content: str) -> str:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 12}
    body |= {"temperature": 0}
    response = requests.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_dp_ranks_take_pinned_requests_and_health_checks_count_nowhere(fleet: Fleet) -> None:
    url = fleet.workers["dp2"]
    before = stats(url)
    pinned = {f"pinned-{i}-{time.time_ns()}": rank for i, rank in enumerate((0, 1, 1))}
    for rid, rank in pinned.items():
        generate(url, "def fib(n):", rid=rid, routed_dp_rank=rank)
    for _ in range(3):  # SGLang's own health checks, beside the router's
        assert requests.get(f"{url}/health_generate", timeout=60).status_code == 200
    after = stats(url)
    finished = {r["dp_rank"]: r["aggregates"]["requests_finished"] for r in after["ranks"]}
    earlier = {r["dp_rank"]: r["aggregates"]["requests_finished"] for r in before["ranks"]}
    assert {rank: finished[rank] - earlier[rank] for rank in (0, 1)} == {0: 1, 1: 2}
    ranks_seen = {e["rid"]: e["dp_rank"] for e in after["requests"] if e["rid"] in pinned}
    assert ranks_seen == pinned  # each request labelled with the rank that ran it
    assert not any(e["rid"].startswith("HEALTH_CHECK") for e in after["requests"])
    # Nothing else ran on this worker but the router's health checks: none was counted.
    total = after["aggregates"]["requests_finished"] - before["aggregates"]["requests_finished"]
    assert total == 3

    metrics = requests.get(f"{url}/metrics", timeout=60).text
    worker = worker_label(url)
    for rank in (0, 1):
        series = f'nanospec:accept_length_count{{dp_rank="{rank}",worker="{worker}"}}'
        assert series in metrics, metrics
    counted = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("nanospec:accept_length_count{")
    )
    assert counted == after["aggregates"]["requests_finished"]  # no health check observed


@pytest.mark.parametrize("policy", POLICIES)
def test_router_passes_generate_and_chat_through_unchanged(fleet: Fleet, policy: str) -> None:
    router, direct = fleet.routers[policy], fleet.workers["one"]
    before = fleet.aggregates()
    routed = [generate(router, text)["output_ids"] for text in PROMPTS]
    assert routed == [generate(direct, text)["output_ids"] for text in PROMPTS]
    assert [chat(router, c) for c in CHATS] == [chat(direct, c) for c in CHATS]
    after = fleet.aggregates()
    sent = {name: after[name].requests_finished - before[name].requests_finished for name in after}
    # through the router: 6 requests to the fleet; directly: 6 more to "one"
    assert sent["dp2"] + sent["one"] == 12
    if policy == "round_robin":  # 3 each, wherever the router's turn started
        assert sent == {"dp2": 3, "one": 9}


def settled(fleet: Fleet, timeout_s: float = 120.0) -> None:
    """Until no worker runs a request and two reads in a row agree: a request is filed at
    the scheduler's next chunk, and slots are freed when it idles, so the figures may still
    move just after the last answer (and earlier tests' requests may still be ending)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        now = fleet.aggregates()
        if now == last and all(a.requests_running == 0 for a in now.values()):
            return
        last = now
        time.sleep(0.5)
    raise AssertionError(f"the fleet's statistics did not settle in {timeout_s} s: {last}")


def read_still(fleet: Fleet, attempts: int = 20) -> tuple[FleetStats, dict[str, Aggregates]]:
    """The fleet view, with the workers' own figures read just before and just after it,
    kept once those two agree and the view saw no request state held. The router's health
    checks (a one-token generate a second) hold request state for a moment, so the live
    gauge `state_bytes_in_use` may move between any two reads of an otherwise still fleet."""
    for _ in range(attempts):
        before = fleet.aggregates()
        view = fetch_fleet(fleet.urls, stats)
        after = fleet.aggregates()
        quiet = view.aggregates.state_bytes_in_use == view.aggregates.state_bytes_idle
        if before == after and quiet:
            return view, after
        time.sleep(0.2)
    raise AssertionError(f"the workers' figures moved across {attempts} reads of the fleet view")


def test_fleet_view_adds_up_across_workers(fleet: Fleet) -> None:
    router = fleet.routers["round_robin"]
    for text in PROMPTS:
        generate(router, text)
    settled(fleet)
    view, parts = read_still(fleet)
    assert view.aggregates == Aggregates.combine(list(parts.values()))
    assert view.aggregates.requests_finished == sum(a.requests_finished for a in parts.values())
    assert {e.worker for e in view.requests} == {worker_label(u) for u in fleet.urls}

    table = nanospec("stats", "--url", ",".join(fleet.urls), "--limit", "50")
    assert table.returncode == 0, table.stderr
    assert "fleet     2 of 2 workers answered" in table.stdout
    for url in fleet.urls:
        assert worker_label(url) in table.stdout
    total = f"{view.aggregates.requests_finished} finished"
    assert total in table.stdout, table.stdout

    dead = f"http://127.0.0.1:{free_port()}"
    partial = nanospec("stats", "--url", fleet.urls[0], "--url", dead)
    assert partial.returncode == 1 and f"--url {dead}" in partial.stderr
    assert "1 of 2 workers answered" in partial.stdout


def worker_w_max(fleet: Fleet) -> list[int]:
    """W_max in force on every DP rank of every worker."""
    return [r["settings"]["w_max"] for url in fleet.urls for r in stats(url)["ranks"]]


def test_config_set_reaches_every_worker_and_rank(fleet: Fleet) -> None:
    urls = ",".join(fleet.urls)
    before = worker_w_max(fleet)
    assert len(before) == 3  # two ranks and one
    done = nanospec("config", "set", "w_max", "640", "--url", urls, "--admin-key", ADMIN_KEY)
    assert done.returncode == 0, done.stderr
    assert worker_w_max(fleet) == [640, 640, 640]
    for url in fleet.urls:
        assert f"{worker_label(url)}  mode=nanospec  w_max=640" in done.stdout
    wrong = nanospec("config", "set", "w_max", "64", "--url", urls, "--admin-key", "nope")
    assert wrong.returncode == 1 and "403" in wrong.stderr
    assert worker_w_max(fleet) == [640, 640, 640]
    restore(fleet, before)


def restore(fleet: Fleet, w_max_per_rank: list[int]) -> None:
    """Back as it was, for the other cases (every rank of a worker has the same)."""
    first_rank = 0
    for url in fleet.urls:
        body = {"w_max": w_max_per_rank[first_rank]}
        requests.post(f"{url}/nanospec/settings", json=body, headers=ADMIN, timeout=60)
        first_rank += len(stats(url)["ranks"])


def test_dashboard_shows_the_fleet_and_changes_every_worker(fleet: Fleet, browser) -> None:  # noqa: F811
    from selenium.webdriver.support.ui import WebDriverWait

    page, other = fleet.urls
    generate(fleet.routers["round_robin"], "def fib(n):")
    browser.get(f"{page}/dashboard?interval=300&workers={page},{other}")
    rows = "#workers tr td:first-child"
    labels = sorted(worker_label(u) for u in fleet.urls)
    WebDriverWait(browser, 60).until(lambda b: sorted(texts(b, rows)) == labels)
    finished = sum(a.requests_finished for a in fleet.aggregates().values())
    WebDriverWait(browser, 60).until(
        lambda b: texts(b, '[data-name="finished"]') == [str(finished)]
    )
    assert texts(browser, '[data-name="DP ranks"]') == ["3"]
    workers_in_table = set(texts(browser, "#requests tr td:last-child"))
    assert workers_in_table == set(labels)

    before = worker_w_max(fleet)
    assert "403" in submit_w_max(browser, 777, "not-the-key")
    assert worker_w_max(fleet) == before
    targets = texts(browser, "#w-max-targets")[0]
    assert all(label in targets for label in labels)
    assert "on 2 workers" in submit_w_max(browser, 777, ADMIN_KEY)
    assert worker_w_max(fleet) == [777, 777, 777]
    WebDriverWait(browser, 30).until(lambda b: texts(b, '[data-name="W_max"]') == ["777"])
    restore(fleet, before)
