"""From a run's records to figures: per configuration and task, with ratios and spreads.

Tokens/s counts the whole request (prefill included, as the paper does): completion
tokens over the client's latency; a batch of concurrent requests, its tokens over its wall
time. Ratios are paired: each prompt's tokens/s in one configuration over the same
prompt's in the other, in the same group, turn and repeat, so the machine's load at that
moment cancels; the median ratio is reported with its quartiles as the spread.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from nanospec_server.bench.configs import AR

OVERALL = "overall"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _spread(values: list[float]) -> tuple[float, float] | None:
    if len(values) < 2:
        return (values[0], values[0]) if values else None
    q = statistics.quantiles(values, n=4, method="inclusive")
    return (q[0], q[2])


def _p90(values: list[float]) -> float | None:
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def _weighted(pairs: list[tuple[float | None, float]]) -> float | None:
    pairs = [(v, w) for v, w in pairs if v is not None and w]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else None


def units(records: list[dict]) -> list[dict]:
    """One measured unit per request at concurrency 1 and per batch above it."""
    out = []
    for r in records:
        if "items" not in r:
            continue
        items = r["items"]
        base = {k: r[k] for k in ("group", "config", "turn", "repeat", "concurrency")}
        if r["concurrency"] == 1:
            for item in items:
                out.append(base | {"id": item["prompt_id"], "task": item["task"], "items": [item],
                                   "tokens": item["completion_tokens"], "seconds": item["latency_s"]})  # fmt: skip
        else:
            ids = ",".join(i["prompt_id"] for i in items)
            tasks = {i["task"] for i in items}
            out.append(base | {"id": ids, "task": tasks.pop() if len(tasks) == 1 else None,
                               "items": items, "tokens": sum(i["completion_tokens"] for i in items),
                               "seconds": r["wall_s"]})  # fmt: skip
    return out


def _cell(units_: list[dict]) -> dict:
    """Figures of one configuration over some units (per task or overall)."""
    items = [i for u in units_ for i in u["items"]]
    by_repeat = defaultdict(lambda: [0, 0.0])
    for u in units_:
        by_repeat[u["repeat"]][0] += u["tokens"]
        by_repeat[u["repeat"]][1] += u["seconds"]
    stats = [i["nanospec"] for i in items if i.get("nanospec")]
    steps = sum(i["verify_steps"] for i in items)
    # The draft's time is timed on CPU servers only (nanospec_server/sglang_plugin/stats/step_timer.py).
    timed = [s for s in stats if s.get("draft_seconds") is not None and s["draft_steps"]]
    draft_s = sum(s["draft_seconds"] for s in timed)
    draft_steps = sum(s["draft_steps"] for s in timed)
    return {
        "requests": len(items),
        "tokens": sum(i["completion_tokens"] for i in items),
        # each request's own latency, from send to its last token (prefill included)
        "latency_median_s": _median([i["latency_s"] for i in items]),
        "latency_p90_s": _p90([i["latency_s"] for i in items]),
        "tokens_per_s": _median([t / s for t, s in by_repeat.values() if s > 0]),
        "accept_length": _weighted([(i["accept_length"], i["verify_steps"]) for i in items]),
        "ms_per_step": 1000 * sum(i["latency_s"] for i in items) / steps if steps else None,
        "draft_ms_per_step": 1000 * draft_s / draft_steps if draft_steps else None,
        "lm_head_share": sum(s["lm_head_seconds"] for s in timed) / draft_s if draft_s else None,
        "coverage": _weighted([(s["coverage"], s["draft_steps"]) for s in stats]),
        "active_vocab": _weighted([(s["active_vocab_mean"], s["draft_steps"]) for s in stats]),
        "lm_head_rows": _weighted([(s["lm_head_rows_mean"], s["lm_head_calls"]) for s in stats]),
        "vocab_size": stats[0]["vocab_size"] if stats else None,
    }


def _speed(u: dict | None) -> float | None:
    return u["tokens"] / u["seconds"] if u and u["seconds"] > 0 and u["tokens"] else None


def _ratios(
    mine: list[dict], theirs: list[dict], through: list[dict] = (), side_by_side: bool = True
) -> dict:
    """Paired tokens/s ratios: median and quartiles. A unit whose partner ran in another
    group (servers in groups of two) is compared through ``through`` (``ar``), measured in
    both groups: (mine / ar beside it) / (theirs / ar beside it). In a run of one server at
    a time (``side_by_side`` False) nothing ran beside it: units compare directly."""
    key = lambda u: (u["group"], u["turn"], u["repeat"], u["id"])  # noqa: E731
    other = {key(u): u for u in theirs}
    elsewhere = {key(u)[1:]: u for u in theirs}
    anchor = {key(u): u for u in through}
    values = []
    for u in mine:
        o = other.get(key(u))
        ratio = None
        if o is not None:
            if u["seconds"] > 0 and _speed(o):
                ratio = (u["tokens"] / u["seconds"]) / _speed(o)
        elif (o := elsewhere.get(key(u)[1:])) is not None:
            mine_ar, theirs_ar = _speed(anchor.get(key(u))), _speed(anchor.get(key(o)))
            if u["seconds"] > 0 and _speed(o) and mine_ar and theirs_ar:
                ratio = ((u["tokens"] / u["seconds"]) / mine_ar) / (_speed(o) / theirs_ar)
            elif not side_by_side and u["seconds"] > 0 and _speed(o):
                ratio = (u["tokens"] / u["seconds"]) / _speed(o)
        if ratio is not None:
            values.append(ratio)
    return {"median": _median(values), "spread": _spread(values), "pairs": len(values)}


def _of_task(units_: list[dict], task: str) -> list[dict]:
    return units_ if task == OVERALL else [u for u in units_ if u["task"] == task]


def summarize(
    records: list[dict], references: dict[str, str | None], side_by_side: bool = True
) -> dict:
    """``{concurrency: {config: {task|overall: figures}}}``; ``references`` maps each
    configuration to its full-vocabulary draft (None for none); ``side_by_side`` is False
    for a run of one server at a time."""
    all_units = units(records)
    result: dict = {}
    for c in sorted({u["concurrency"] for u in all_units}):
        at_c = [u for u in all_units if u["concurrency"] == c]
        per_config = defaultdict(list)
        for u in at_c:
            per_config[u["config"]].append(u)
        tasks = list(dict.fromkeys(u["task"] for u in at_c if u["task"] is not None))
        table = {}
        for config, mine in per_config.items():
            cells = {}
            for task in [*tasks, OVERALL]:
                subset = _of_task(mine, task)
                if not subset:
                    continue
                cell = _cell(subset)
                ar = _of_task(per_config.get(AR, []), task)
                cell["vs_ar"] = _ratios(subset, ar, (), side_by_side) if config != AR else None
                ref = references.get(config)
                full = _of_task(per_config.get(ref, []), task)
                paired = ref and ref != config
                cell["vs_full"] = _ratios(subset, full, ar, side_by_side) if paired else None
                cells[task] = cell
            table[config] = cells
        result[c] = table
    return result


def lossless(records: list[dict], bitwise_expected: bool = False) -> dict:
    """Per configuration: outputs compared with ``ar``'s (beside it, else in any group: a
    run of one server at a time), how many differed, and the divergences the runner probed.
    Where speculation is bit-identical (``host.bitwise_lossless``), each one is a bug."""
    plain, anywhere = {}, {}
    for r in records:
        if r.get("config") == AR:
            for i in r["items"]:
                key = (r["turn"], r["repeat"], r["concurrency"], i["prompt_id"])
                plain[(r["group"], *key)] = anywhere[key] = i["output_ids"]
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in records:
        if r.get("config") in (None, AR):
            continue
        for i in r["items"]:
            key = (r["turn"], r["repeat"], r["concurrency"], i["prompt_id"])
            ref = plain.get((r["group"], *key), anywhere.get(key))
            if ref is not None:
                counts[r["config"]][0] += 1
                counts[r["config"]][1] += ref != i["output_ids"]
    probed = [d for r in records for d in r.get("divergences", [])]
    differing = sum(v[1] for v in counts.values())
    return {"compared": {k: {"outputs": v[0], "differing": v[1]} for k, v in counts.items()},
            "divergences": probed, "bitwise_expected": bitwise_expected,
            "bugs": differing if bitwise_expected else 0}  # fmt: skip
