"""Requests whose constraints leave no token to sample, against real tiny servers (plain and
speculative, one at a time): each ends alone with a 400 that names its fields, a greedy
request sent beside it stays plain decoding token for token, and the server keeps serving.

The family: grammars (json_schema / regex / ebnf) that end before `min_new_tokens`, and
`min_new_tokens` with every token a stop id, under seeded sampling settings (temperature,
top-k/top-p/min-p, penalties, logit bias, stop ids), greedy among them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from nanospec_server.launch.server import REQUEST_TIMEOUT_S, generate, speculative_flags
from nanospec_server.models.tiny.tokenizer import VOCAB_SIZE
from tests.serving.conftest import make_prompts

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

SPEC_FLAGS = speculative_flags("EAGLE", "tiny-eagle", 3, 1, 4) + ["--nanospec-mode", "nanospec"]
GREEDY_NEW_TOKENS = 48
GREEDY_PROMPTS = make_prompts(count=4, seed=77, max_len=40)

# The request that stopped the scheduler, as it was sent.
REPORTED = {
    "input_ids": [432, 0, 363],
    "sampling_params": {
        "json_schema": '{"type": "object"}',
        "min_new_tokens": 4,
        "max_new_tokens": 6,
        "frequency_penalty": 1.6,
        "temperature": 0.39,
        "logit_bias": {"94": 9e-299, "6": -0.5, "8": -0.33},
        "top_k": 42,
        "presence_penalty": 5e-175,
        "repetition_penalty": 0.64,
        "min_p": 0.43,
        "stop_token_ids": [364, 507, 93],
        "top_p": 0.8,
    },
}
# Each allows one token and then only the end, or (the last) no token at all.
SHORT_GRAMMARS = [
    {"ebnf": 'root ::= "a" | "b"'},
    {"regex": "a"},
    {"json_schema": '{"const": 1}'},
    {"stop_token_ids": list(range(VOCAB_SIZE))},
]


def impossible_requests(count: int, seed: int) -> list[dict]:
    """`count` requests, each certain to reach a row with no token left."""
    rng = random.Random(seed)
    bodies = []
    for index in range(count):
        params = dict(SHORT_GRAMMARS[index % len(SHORT_GRAMMARS)])
        params["min_new_tokens"] = rng.randint(2, 5)
        params["max_new_tokens"] = params["min_new_tokens"] + rng.randint(0, 4)
        params["temperature"] = rng.choice([0.0, 0.39, 1.0, 1.7])
        for name, values in [
            ("top_k", [1, 5, 42]),
            ("top_p", [0.3, 0.8]),
            ("min_p", [0.1, 0.43]),
            ("frequency_penalty", [-2.0, 1.6]),
            ("presence_penalty", [5e-175, 2.0]),
            ("repetition_penalty", [0.64, 2.0]),
        ]:
            if rng.random() < 0.5:
                params[name] = rng.choice(values)
        if rng.random() < 0.5:
            params["logit_bias"] = {str(rng.randrange(VOCAB_SIZE)): rng.uniform(-5, 5)}
        if "stop_token_ids" not in params and rng.random() < 0.5:
            params["stop_token_ids"] = rng.sample(range(VOCAB_SIZE), 3)
        prompt = [rng.randrange(3, VOCAB_SIZE) for _ in range(rng.randint(1, 30))]
        bodies.append({"input_ids": prompt, "sampling_params": params})
    return bodies


CASES = [("reported", REPORTED)] + [
    (f"family-{index}", body) for index, body in enumerate(impossible_requests(12, seed=4242))
]


@pytest.fixture(scope="module")
def plain_decoding(serve) -> list[list[int]]:
    """The greedy prompts' outputs on the package's plain server, which is never sent an
    impossible request (the plain server under test is a fresh one)."""
    with serve("tiny-target", []) as url:
        return [generate(url, p, GREEDY_NEW_TOKENS)["output_ids"] for p in GREEDY_PROMPTS]


@pytest.fixture(scope="module", params=["plain", "spec"])
def url(request: pytest.FixtureRequest, serve, plain_decoding) -> Iterator[str]:
    flags = SPEC_FLAGS if request.param == "spec" else []
    with serve("tiny-target", flags, fresh=True) as url:
        yield url


def post(url: str, body: dict) -> requests.Response:
    return requests.post(f"{url}/generate", json=body, timeout=REQUEST_TIMEOUT_S)


def assert_serving(url: str, what: str) -> None:
    try:
        status = requests.get(f"{url}/health_generate", timeout=120).status_code
    except requests.RequestException as error:
        pytest.fail(f"the server stopped after {what}: {error}")
    assert status == 200, f"the server is unhealthy after {what}"


@pytest.mark.parametrize(("name", "body"), CASES, ids=[name for name, _ in CASES])
def test_a_request_with_no_token_left_ends_alone_with_a_400(
    url: str, plain_decoding: list[list[int]], name: str, body: dict
) -> None:
    index = sum(map(ord, name)) % len(GREEDY_PROMPTS)
    with ThreadPoolExecutor(max_workers=2) as pool:
        # The greedy neighbour is sent first and runs longer, so both share batches.
        greedy = pool.submit(generate, url, GREEDY_PROMPTS[index], GREEDY_NEW_TOKENS)
        response = pool.submit(post, url, body).result()
        neighbour = greedy.result()["output_ids"]
    assert_serving(url, f"{name}: {json.dumps(body)}")
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert message.startswith(("min_new_tokens: ", "sampling_params: no token is left")), message
    assert neighbour == plain_decoding[index]


def test_sampled_requests_beside_them_still_complete(url: str) -> None:
    """The guard leaves rows with tokens alone: ordinary sampled requests finish normally."""
    body = {
        "input_ids": GREEDY_PROMPTS[0],
        "sampling_params": {"max_new_tokens": 8, "temperature": 0.8, "top_p": 0.9},
    }
    with ThreadPoolExecutor(max_workers=3) as pool:
        sampled = pool.submit(post, url, body)
        impossible = pool.submit(post, url, CASES[1][1])
        assert impossible.result().status_code == 400
        assert sampled.result().status_code == 200, sampled.result().text
    assert_serving(url, "a sampled request")
