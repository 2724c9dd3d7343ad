"""An API fuzzer (schemathesis) against a real tiny NanoSpec server: no 5xx, no hang, and
the server keeps serving: it answers /health_generate after every case (a failure names
the case that stopped it), and greedy requests sent all along equal plain decoding.

The server is the tiny target with the tiny EAGLE draft in `--nanospec-mode nanospec`, with
an admin key; a plain-decoding server of the same target, started beside it, answers the
probe prompts once for reference. Cases come from the server's own /openapi.json, narrowed
to the fuzzed routes with targeted bodies (`fuzz_schemas.py`); each operation gets positive
cases (valid by that schema) and negative ones (schemathesis breaks it on purpose), with a
fixed Hypothesis seed so a CI run sends the same cases every time. A second run, on both
servers, sends `/generate` bodies that always carry a grammar and mostly sample, with
min_new_tokens, stop ids, penalties, logit bias and top-k/top-p/min-p drawn together
(`fuzz_constrained.py`): the combinations that leave a row no token to sample.

Bounds (CI): FUZZ_CASES cases per operation and mode (default 15, ~200 in all), and a
wall-clock budget per operation and mode that ends its run early; Hypothesis' generate
phase only (no shrinking: a failure reports the case as a curl command instead); no
schemathesis coverage phase (it sends no request within 500 s here). The longer run,
at a fresh seed that it prints first (and in every failure):
`NANOSPEC_FUZZ_CASES=400 NANOSPEC_FUZZ_SEED=random python -m pytest -s tests/serving/test_api_fuzz.py`
(docs/testing.md, "API fuzzer"); `NANOSPEC_FUZZ_SEED=<printed seed>` sends the same cases again.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from nanospec_server.launch.server import generate, running_servers, speculative_flags
from nanospec_server.models.tiny import tiny_model_path
from tests.serving.conftest import ADMIN_KEY, BASE_FLAGS, make_prompts
from tests.serving.fuzz_constrained import constrained_bodies
from tests.serving.fuzz_schemas import OPERATIONS, narrowed_schema

FUZZ_CASES = int(os.environ.get("NANOSPEC_FUZZ_CASES", "15"))
# A fixed seed in CI (the same cases every run); "random" for exploring runs.
_SEED = os.environ.get("NANOSPEC_FUZZ_SEED", "23")
FUZZ_SEED = random.randrange(2**32) if _SEED == "random" else int(_SEED)
# Per operation and mode; a generous bound that a loaded host still meets in CI.
BUDGET_S = float(os.environ.get("NANOSPEC_FUZZ_BUDGET_S", str(max(60, 3 * FUZZ_CASES))))
CASE_TIMEOUT_S = 120  # a case that takes longer than this is a hang
PROBE_NEW_TOKENS = 24
PROBE_PROMPTS = make_prompts(count=4, seed=2323, max_len=60)
CONTEXT_LENGTH = 1024  # caps what a negative case's huge max_tokens can cost

# One test may include both servers' start (the module fixture) on a loaded host, its
# operation's budget, and one hung case.
pytestmark = [pytest.mark.engine, pytest.mark.timeout(1200 + BUDGET_S + 2 * CASE_TIMEOUT_S)]

SPEC_FLAGS = speculative_flags("EAGLE", "tiny-eagle", 3, 1, 4) + ["--nanospec-mode", "nanospec"]
ADMIN_HEADERS = [
    {},
    {"X-Admin-Key": ADMIN_KEY},
    {"Authorization": f"Bearer {ADMIN_KEY}"},
    {"X-Admin-Key": "wrong-key"},
]


@dataclass
class Probe:
    """Greedy requests sent while the fuzzer runs, each checked against plain decoding."""

    url: str
    expected: list[list[int]]
    sent: int = 0
    mismatches: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            index = self.sent % len(PROBE_PROMPTS)
            # Every other round of prompts asks for its own small W_max: same output.
            own_w_max = (self.sent // len(PROBE_PROMPTS)) % 2
            own = {"custom_params": {"w_max": 4}} if own_w_max else {}
            try:
                result = generate(self.url, PROBE_PROMPTS[index], PROBE_NEW_TOKENS, **own)
            except requests.RequestException as error:
                self.errors.append(f"probe {self.sent}: {error}")
                self.stop.wait(1)
            else:
                if result["output_ids"] != self.expected[index]:
                    self.mismatches.append(f"probe {self.sent} (prompt {index}, {own})")
            self.sent += 1


@dataclass
class Target:
    url: str  # the speculative server, which the schema-driven cases go to
    plain_url: str
    schema: schemathesis.BaseSchema
    probe: Probe
    report: dict[str, Counter] = field(default_factory=dict)


def assert_still_serving(url: str, case: str) -> None:
    """Fail naming `case` unless the server at `url` still generates."""
    try:
        status = requests.get(f"{url}/health_generate", timeout=CASE_TIMEOUT_S).status_code
    except requests.RequestException as error:
        status = error
    if status != 200:
        pytest.fail(
            f"the server stopped serving ({status}) after this case "
            f"(NANOSPEC_FUZZ_SEED={FUZZ_SEED}):\n{case}"
        )


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    logs = Path(tmp_path_factory.mktemp("fuzz"))
    common = BASE_FLAGS + ["--context-length", str(CONTEXT_LENGTH)]
    model = ["--model-path", str(tiny_model_path("tiny-target"))]
    servers = {
        "plain": (model + common, logs / "plain.log"),
        "spec": (model + common + SPEC_FLAGS, logs / "spec.log"),
    }
    print(f"\nAPI fuzz seed {FUZZ_SEED} (NANOSPEC_FUZZ_SEED={FUZZ_SEED} sends these cases again)")
    with running_servers(servers) as urls:
        expected = [
            generate(urls["plain"], p, PROBE_NEW_TOKENS)["output_ids"] for p in PROBE_PROMPTS
        ]
        url = urls["spec"]
        w_cap = requests.get(f"{url}/nanospec/config", timeout=60).json()["w_cap"]
        served = requests.get(f"{url}/openapi.json", timeout=60).json()
        schema = schemathesis.openapi.from_dict(narrowed_schema(served, w_cap))
        # Its default masks any key naming a token (max_tokens!) in the curl it reports.
        schema.config.output.sanitization.update(enabled=False)
        probe = Probe(url, expected)
        thread = threading.Thread(target=probe.run, daemon=True)
        thread.start()
        fuzzed = Target(url, urls["plain"], schema, probe)
        try:
            yield fuzzed
        finally:
            probe.stop.set()
            thread.join(timeout=CASE_TIMEOUT_S)
            print(
                f"\nAPI fuzz (seed {FUZZ_SEED}, up to {FUZZ_CASES} cases per operation and mode):"
            )
            for name, statuses in fuzzed.report.items():
                print(
                    f"  {name}: {sum(statuses.values())} cases, statuses {dict(sorted(statuses.items()))}"
                )
            print(f"  probes: {probe.sent} greedy requests, {len(probe.mismatches)} differed")


class BudgetSpent(Exception):
    """Ends an operation's Hypothesis run when its wall-clock budget is spent: Hypothesis has
    no time limit, and rejecting the remaining examples still pays for generating them."""


def whole_floats_as_ints(value: object) -> object:
    """`4.0` for `4`, throughout: JSON Schema counts 4.0 as an integer, so schemathesis sends
    it for integer fields, but SGLang's request parsing (and our strict settings model) take
    only 4 and answer 400. Positive cases would then rarely reach the model; negative cases
    keep the floats."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [whole_floats_as_ints(item) for item in value]
    if isinstance(value, dict):
        return {key: whole_floats_as_ints(item) for key, item in value.items()}
    return value


def fuzz_run(test):
    """A fuzz run's Hypothesis settings: this run's seed, the generate phase only (a failure
    reports its case as a curl command, unshrunk), FUZZ_CASES cases."""
    return seed(FUZZ_SEED)(
        settings(
            max_examples=FUZZ_CASES,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
            print_blob=True,
        )(test)
    )


FUZZED = [(path, method, mode) for path, method, modes in OPERATIONS for mode in modes]


@pytest.mark.parametrize(
    ("path", "method", "mode"), FUZZED, ids=[f"{m.upper()} {p} {mode}" for p, m, mode in FUZZED]
)
def test_fuzzed_operation_never_gets_a_server_error(
    target: Target, path: str, method: str, mode: str
) -> None:
    operation = target.schema[path][method.upper()]
    strategy = operation.as_strategy(generation_mode=schemathesis.GenerationMode(mode))
    statuses = target.report.setdefault(f"{method.upper()} {path} {mode}", Counter())
    deadline = time.monotonic() + BUDGET_S
    failed = False  # once a case fails, its replay must fail the same way, budget or not
    headers = st.sampled_from(ADMIN_HEADERS) if path == "/nanospec/settings" else st.just({})

    @fuzz_run
    @given(case=strategy, extra_headers=headers)
    def send(case: schemathesis.Case, extra_headers: dict[str, str]) -> None:
        nonlocal failed
        if not failed and time.monotonic() > deadline:
            raise BudgetSpent
        if mode == "positive":
            case.body = whole_floats_as_ints(case.body)
        curl = case.as_curl_command(extra_headers)
        try:
            response = case.call(base_url=target.url, headers=extra_headers, timeout=CASE_TIMEOUT_S)
        except requests.Timeout:
            failed = True
            pytest.fail(f"no answer in {CASE_TIMEOUT_S} s (a hang):\n{curl}")
        except requests.ConnectionError:
            failed = True
            assert_still_serving(target.url, curl)
            raise
        statuses[response.status_code] += 1
        try:
            assert_still_serving(target.url, curl)
        except BaseException:
            failed = True
            raise
        try:
            case.validate_response(response, checks=[not_a_server_error], headers=extra_headers)
        except BaseException:
            failed = True
            raise

    try:
        send()
    except BudgetSpent:
        pass  # the cases sent within the budget stand
    assert sum(statuses.values()) > 0, "no case was sent"


@pytest.mark.parametrize("server", ["spec", "plain"])
def test_constrained_sampling_never_stops_the_server(target: Target, server: str) -> None:
    url = target.url if server == "spec" else target.plain_url
    statuses = target.report.setdefault(f"POST /generate constrained {server}", Counter())
    deadline = time.monotonic() + BUDGET_S
    failed = False  # as above: a failing case's replay must fail the same way

    @fuzz_run
    @given(body=constrained_bodies())
    def send(body: dict) -> None:
        nonlocal failed
        if not failed and time.monotonic() > deadline:
            raise BudgetSpent
        curl = (
            f"curl -X POST {url}/generate -H 'content-type: application/json' "
            f"-d '{json.dumps(body)}'"
        )
        try:
            try:
                response = requests.post(f"{url}/generate", json=body, timeout=CASE_TIMEOUT_S)
            except requests.Timeout:
                pytest.fail(f"no answer in {CASE_TIMEOUT_S} s (a hang):\n{curl}")
            except requests.ConnectionError:
                assert_still_serving(url, curl)
                raise
            statuses[response.status_code] += 1
            assert_still_serving(url, curl)
            assert response.status_code < 500, f"{response.status_code}: {response.text}\n{curl}"
        except BaseException:
            failed = True
            raise

    try:
        send()
    except BudgetSpent:
        pass
    assert sum(statuses.values()) > 0, "no case was sent"


# Bodies SGLang alone answers with a 500, which nanospec_server refuses with a 400
# (docs/testing.md, "API fuzzer").
CHAT = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 8}
SHORT_GRAMMAR = 'root ::= "a" | "b"'  # one token, then only EOS
FOUND = [
    (
        "/generate",
        {"text": "a", "sampling_params": {"max_new_tokens": 2, "stop_regex": "("}},
        "stop_regex",
    ),
    ("/v1/completions", {"prompt": "a", "max_tokens": 2, "stop_regex": ["a", "("]}, "stop_regex"),
    ("/v1/chat/completions", CHAT | {"stop_regex": "("}, "stop_regex"),
    ("/v1/chat/completions", CHAT | {"response_format": -6355}, "response_format"),
    (
        "/v1/chat/completions",
        CHAT | {"response_format": {"type": "json_schema", "schema": "x"}},
        "response_format.schema",
    ),
    ("/v1/chat/completions", [], "body"),
    ("/v1/chat/completions", None, "body"),
    ("/v1/chat/completions", CHAT | {"ebnf": SHORT_GRAMMAR, "min_tokens": 3}, "min_new_tokens"),
    (
        "/generate",
        {
            "text": "a",
            "sampling_params": {"max_new_tokens": 8, "min_new_tokens": 3, "ebnf": SHORT_GRAMMAR},
        },
        "min_new_tokens",
    ),
    # SGLang copies the request n times in the HTTP process: this n stopped the server.
    ("/v1/completions", {"prompt": "a", "max_tokens": 2, "n": 800797}, "n"),
    ("/v1/chat/completions", CHAT | {"n": 800797}, "n"),
    ("/generate", {"text": "a", "sampling_params": {"n": 800797}}, "sampling_params.n"),
]


@pytest.mark.parametrize(("path", "body", "field"), FOUND)
def test_bodies_sglang_crashes_on_are_a_400_naming_the_field(
    target: Target, path: str, body, field: str
) -> None:
    response = requests.post(
        f"{target.url}{path}",
        data=json.dumps(body),  # `json=None` would send no body at all
        headers={"Content-Type": "application/json"},
        timeout=CASE_TIMEOUT_S,
    )
    assert response.status_code == 400, response.text
    assert f"{field}: " in response.text, response.text


def test_server_kept_serving_and_greedy_output_equals_plain_decoding(target: Target) -> None:
    probe = target.probe
    # Every probe prompt, with and without its own W_max, at least once (a run of few
    # cases may end sooner); then stop the probe.
    deadline = time.monotonic() + 4 * CASE_TIMEOUT_S
    while probe.sent < 2 * len(PROBE_PROMPTS) and time.monotonic() < deadline:
        time.sleep(1)
    probe.stop.set()
    assert probe.sent >= 2 * len(PROBE_PROMPTS), f"only {probe.sent} probes ran"
    assert not probe.errors, probe.errors
    assert not probe.mismatches, probe.mismatches
    assert requests.get(f"{target.url}/health_generate", timeout=60).status_code == 200
    stats = requests.get(f"{target.url}/stats/vocab", timeout=60)
    assert stats.status_code == 200, stats.text
