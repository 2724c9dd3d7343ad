"""The draft's lazy catch-up after depth-0 steps is exact.

After a run of plain depth-0 steps the draft runs once over the positions it missed. Its
KV and next input must then be what the reference leaves, the same server with
`--nanospec-adaptive-keep-extend` (the draft extend on every step): so every drafting step
proposes the same draft tree at the same position. The random tiny target and drafts whose
proposals depend on their context (an EAGLE head with its own KV, a small STANDALONE LM), in
fp32: a draft that drafted over stale KV proposes other tokens. Proposals are read from the
candidate stream each server records (`NANOSPEC_RECORD_STREAMS`: each step's draft tree
with the position of its root), keyed by request and position.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from nanospec_server.launch.server import speculative_flags
from tests.serving.conftest import ADMIN_KEY, make_prompts
from tests.serving.test_adaptive_lossless import adaptive_stats, change_settings

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]

DEPTH = 3
# The full vocabulary: the proposals then depend on the draft's state alone (a prefill at
# depth 0 goes without NanoSpec's top-K_pre, which would change the lazy server's window).
FLAGS = ["--nanospec-adaptive", "--nanospec-mode", "full"]
KINDS = {
    "eagle-chain": speculative_flags("EAGLE", "tiny-eagle", DEPTH, 1, DEPTH + 1),
    "standalone-chain": speculative_flags("STANDALONE", "tiny-standalone", DEPTH, 1, DEPTH + 1),
}
PROMPTS = make_prompts(count=6, seed=31, max_len=120)
MAX_NEW = 90
SCHEDULE = [0, DEPTH] * 4  # depths pinned in turn, each for SPAN tokens of the first request
SPAN = 9


def pin(url: str, depth: int) -> None:
    response = change_settings(url, {"adaptive_depth": depth})
    assert response.status_code == 200, response.text


def flush_cache(url: str) -> None:
    """Empty the radix cache: SGLang's health check prefilled a [BOS] there, with the
    draft's KV, and every prompt would otherwise start past it."""
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    response = requests.post(f"{url}/flush_cache", headers=headers, timeout=60)
    assert response.status_code == 200, response.text


def run_requests(url: str, rid_prefix: str) -> list[list[int]]:
    """The prompts together, greedy, with fixed rids; the first is streamed and its tokens
    move the pinned depth through SCHEDULE, so every request lives through depth-0 runs
    and drafting alike. The radix cache holds SGLang's health check's [BOS], with the
    draft's KV, and every prompt starts with it: the prompts share nothing else, so which
    of them arrive in one prefill cannot change what either server's draft KV holds
    (prefixes shared among them: `run_shared_prefix_requests`)."""

    def one(i: int) -> list[int]:
        params = {"temperature": 0.0, "max_new_tokens": MAX_NEW}
        body = {"input_ids": PROMPTS[i], "sampling_params": params, "rid": f"{rid_prefix}-{i}"}
        if i > 0:
            reply = requests.post(f"{url}/generate", json=body, timeout=600)
            assert reply.status_code == 200, reply.text
            return reply.json()["output_ids"]
        schedule = list(SCHEDULE)
        output: list[int] = []
        with requests.post(
            f"{url}/generate", json=body | {"stream": True}, stream=True, timeout=600
        ) as reply:
            for line in reply.iter_lines():
                if line.startswith(b"data: {"):
                    output = json.loads(line[len(b"data: ") :])["output_ids"]
                    while schedule and len(output) >= SPAN * (len(SCHEDULE) - len(schedule)):
                        pin(url, schedule.pop(0))
        return output

    pin(url, SCHEDULE[0])
    with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
        return list(pool.map(one, range(len(PROMPTS))))


def draft_trees(path: Path) -> tuple[dict[tuple[str, int], list[int]], set]:
    """(rid, root position) -> the draft tree proposed there, for steps that drafted; and
    the keys of those whose request's step before was a depth-0 step."""
    trees, after_depth_0, last_size = {}, set(), {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if entry["kind"] != "step":
            continue
        rid, size = entry["rid"], entry["tree_size"]
        if size > 1:
            key = (rid, entry["position"])
            trees[key] = entry["tokens"][:size]  # the tree, root first; top-K_ver follows
            if last_size.get(rid) == 1:
                after_depth_0.add(key)
        last_size[rid] = size
    return trees, after_depth_0


def run_radix_requests(url: str, rid_prefix: str) -> list:
    """A request decoded at depth 0 throughout, then one whose prompt is that request's
    prompt and answer and a few more tokens, drafting from its first step: its prefix
    comes from the radix cache, with draft KV the lazy server never wrote."""
    pin(url, 0)
    first = generate_with_rid(url, PROMPTS[1], 40, f"{rid_prefix}-a")
    pin(url, DEPTH)
    prompt = PROMPTS[1] + first["output_ids"] + PROMPTS[2][1:9]
    second = generate_with_rid(url, prompt, 30, f"{rid_prefix}-b")
    return [first["output_ids"], second["output_ids"], second["meta_info"]["cached_tokens"]]


def run_shared_prefix_requests(url: str, rid_prefix: str) -> list[list[int]]:
    """Two requests whose prompts share a prefix, both prefilled at depth 0 (the second
    from the radix cache, while the first decodes), then drafting: one catch-up extend runs
    both over positions they share, and the last shared position's draft KV (computed from
    the token after it, which differs between them) must hold what the first one's prefill
    would have written there. The cache is emptied first and the second request is sent
    after the first one's first token, so that which request wrote the prefix is the same
    on every server."""
    common = PROMPTS[3][:12]
    first = {"input_ids": common + PROMPTS[4][1:5], "rid": f"{rid_prefix}-a", "stream": True}
    second = {"input_ids": common + PROMPTS[5][1:4], "rid": f"{rid_prefix}-b"}
    flush_cache(url)
    pin(url, 0)
    output: list[int] = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        params = {"temperature": 0.0, "max_new_tokens": 60}
        body = first | {"sampling_params": params}
        with requests.post(f"{url}/generate", json=body, stream=True, timeout=600) as reply:
            sent, drafting = None, False
            for line in reply.iter_lines():
                if not line.startswith(b"data: {"):
                    continue
                output = json.loads(line[len(b"data: ") :])["output_ids"]
                if sent is None:
                    sent = pool.submit(generate_with_rid, url, second["input_ids"], 50,
                                       second["rid"])  # fmt: skip
                if len(output) >= 12 and not drafting:
                    pin(url, DEPTH)
                    drafting = True
        assert sent is not None
        reply_b = sent.result()
    return [output, reply_b["output_ids"], reply_b["meta_info"]["cached_tokens"]]


def generate_with_rid(url: str, input_ids: list[int], max_new: int, rid: str) -> dict:
    params = {"temperature": 0.0, "max_new_tokens": max_new}
    body = {"input_ids": input_ids, "sampling_params": params, "rid": rid}
    reply = requests.post(f"{url}/generate", json=body, timeout=600)
    assert reply.status_code == 200, reply.text
    return reply.json()


COUNTERS = ("catch_up_tokens", "catch_up_positions_left_stale", "draft_prefills_skipped")


def since(before: dict, after: dict) -> dict:
    """``after`` with the catch-up's counters less those of ``before``."""
    return after | {name: after[name] - before[name] for name in COUNTERS}


@dataclass
class Recorded:
    """What one server did in each scenario: `run_requests` (``outputs``, the catch-up's
    counters over it, /stats/vocab's per-request entries after it), then, on an emptied
    radix cache, `run_prefix_requests` (``prefix_runs``); and the draft trees of both."""

    outputs: list[list[int]]
    stats: dict
    per_request: list[dict]
    prefix_runs: dict
    trees: dict[tuple[str, int], list[int]]
    after_depth_0: set


def record(serve, path: Path, kind: str, extra: list[str]) -> Recorded:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NANOSPEC_RECORD_STREAMS", str(path))
        with serve("tiny-target", KINDS[kind] + FLAGS + extra) as url:
            before = adaptive_stats(url)  # SGLang's health check is a request too
            outputs = run_requests(url, "r")
            stats = since(before, adaptive_stats(url))
            per_request = requests.get(f"{url}/stats/vocab", timeout=60).json()["requests"]
            # the prefix scenarios' first request must not find its prompt cached here
            flush_cache(url)
            prefix_runs = run_prefix_requests(url, "r")
    return Recorded(outputs, stats, per_request, prefix_runs, *draft_trees(path))


@pytest.fixture(scope="module", params=list(KINDS))
def servers(request, serve, tmp_path_factory) -> tuple[Recorded, Recorded]:
    """Per draft kind: the lazy server and the reference (`--nanospec-adaptive-keep-extend`),
    one start each for every scenario."""
    kind = request.param
    root = Path(tmp_path_factory.mktemp("stream"))
    lazy = record(serve, root / "lazy.jsonl", kind, [])
    reference = record(serve, root / "reference.jsonl", kind, ["--nanospec-adaptive-keep-extend"])
    return lazy, reference


def test_catch_up_drafts_what_an_extend_on_every_step_drafts(servers) -> None:
    lazy, reference = servers
    stats, ref_stats = lazy.stats, reference.stats
    trees, ref_trees, after_run = lazy.trees, reference.trees, lazy.after_depth_0
    assert lazy.outputs == reference.outputs  # greedy: both plain decoding's
    shared = set(trees) & set(ref_trees)
    differing = sorted(key for key in shared if trees[key] != ref_trees[key])
    assert not differing, [(key, trees[key], ref_trees[key]) for key in differing[:5]]
    # drafting steps right after a depth-0 run on the lazy server are among those compared
    assert len(shared & after_run) >= 5, (len(shared), len(after_run))
    assert stats["catch_up_tokens"] > 0 and stats["catch_up_positions_left_stale"] == 0, stats
    assert ref_stats["catch_up_tokens"] == 0, ref_stats
    assert stats["draft_prefills_skipped"] > 0, stats  # the prompts arrived at depth 0
    caught = sum(entry.get("catch_up_tokens", 0) for entry in lazy.per_request)
    assert caught == stats["catch_up_tokens"], (caught, stats["catch_up_tokens"])


def run_prefix_requests(url: str, rid_prefix: str) -> dict:
    """`run_radix_requests`, then `run_shared_prefix_requests`, each with the catch-up's
    counters over it."""
    before = adaptive_stats(url)
    radix = run_radix_requests(url, f"{rid_prefix}x")
    between = adaptive_stats(url)
    shared = run_shared_prefix_requests(url, f"{rid_prefix}y")
    after = adaptive_stats(url)
    return {
        "radix": radix,
        "shared": shared,
        "radix_stats": since(before, between),
        "shared_stats": since(between, after),
    }


def test_prefixes_from_the_radix_cache_are_caught_up_as_their_writers_wrote_them(
    servers,
) -> None:
    """Draft validity is per KV slot, and so are the draft's inputs kept there (the
    writer's next token; the target's hidden state for an EAGLE draft).

    A prefix from the radix cache that holds positions decoded at depth 0 (and a prompt
    prefilled without the draft) is run through the draft with the prefill that reuses it,
    so the request drafts from its first step as over an exact cache (``rx-b``). Two
    requests that share a radix prefix and both missed the draft's prefill catch up in one
    extend: each shared slot is written once, from the sequence of the request that wrote
    it, so both draft as over the reference's cache (``ry-a``, ``ry-b``)."""
    lazy, reference = servers
    runs, ref_runs = lazy.prefix_runs, reference.prefix_runs
    trees, ref_trees = lazy.trees, reference.trees
    radix, ref_radix = runs["radix"], ref_runs["radix"]
    assert radix[:2] == ref_radix[:2]
    assert radix[2] > len(PROMPTS[1])  # the second request reused the first's answer
    second = {key: tree for key, tree in trees.items() if key[0] == "rx-b"}
    assert len(second) >= 10, trees
    assert all(ref_trees.get(key) == tree for key, tree in second.items())
    stats = runs["radix_stats"]
    assert stats["catch_up_tokens"] >= radix[2] - 1, stats  # the prefix, prompt included
    assert stats["catch_up_positions_left_stale"] == 0, stats

    shared = runs["shared"]
    assert shared == ref_runs["shared"]
    # the second request's prompt came partly from the radix cache (its 12 shared tokens;
    # an EAGLE server's cache keys token pairs, one fewer)
    assert shared[2] >= 11
    stats = runs["shared_stats"]
    assert stats["draft_prefills_skipped"] == 2, stats
    assert stats["catch_up_positions_left_stale"] == 0, stats
    both = {key for key in set(trees) & set(ref_trees) if key[0] in ("ry-a", "ry-b")}
    assert {rid for rid, _ in both} == {"ry-a", "ry-b"}, both
    differing = sorted(key for key in both if trees[key] != ref_trees[key])
    assert not differing, [(key, trees[key], ref_trees[key]) for key in differing[:5]]
