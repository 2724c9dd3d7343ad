"""`nanospec stats [--watch] [--url]` and `nanospec config get|set`: a running server's admin API.

`--url` may be given several times, or as a comma list: `stats` then shows the fleet (each
worker's figures, labelled by its host:port, and their sums) and `config set` sends the
change to every worker.

Wire into the main parser with `add_admin_commands(subparsers)`; each command stores its
runner in `args.func`.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from functools import partial

import requests

from nanospec_server import env
from nanospec_server.admin.auth import ADMIN_KEY_HEADER
from nanospec_server.admin.fleet import FleetStats, fetch_fleet, worker_label, worker_urls

DEFAULT_URL = "http://127.0.0.1:30000"
SETTINGS = ("w_max", "k_pre", "k_ver", "adaptive")
SWITCH_VALUES = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}
TIMEOUT_S = 30


class AdminError(Exception):
    """A failure the user can act on; printed as one line."""


def _add_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", action="append", metavar="URL",
        help=f"server URL; repeat it or give a comma list for several workers "
        f"(default: ${env.URL} or {DEFAULT_URL})",
    )  # fmt: skip


def add_admin_commands(subparsers: argparse._SubParsersAction) -> None:
    stats = subparsers.add_parser(
        "stats", help="per-request NanoSpec statistics of a running server, as a table"
    )
    _add_url(stats)
    stats.add_argument(
        "--watch", nargs="?", type=float, const=2.0, default=None, metavar="SECONDS",
        help="refresh every SECONDS (default 2) until Ctrl-C",
    )  # fmt: skip
    stats.add_argument(
        "--state", choices=["running", "finished", "aborted"], help="only these requests"
    )
    stats.add_argument("--limit", type=int, default=20, help="requests shown (default 20)")
    stats.set_defaults(func=run_stats)

    config = subparsers.add_parser("config", help="read or change a running server's settings")
    actions = config.add_subparsers(dest="config_command", required=True)
    get = actions.add_parser("get", help="the settings in force")
    _add_url(get)
    get.set_defaults(func=run_config)
    put = actions.add_parser("set", help="change one setting live (needs the admin key)")
    put.add_argument("key", choices=SETTINGS, help="the setting")
    put.add_argument("value", help="its new value (adaptive: on or off)")
    _add_url(put)
    put.add_argument(
        "--admin-key", default=env.admin_key(),
        help=f"the server's --admin-api-key (default: ${env.ADMIN_KEY})",
    )  # fmt: skip
    put.set_defaults(func=run_config)


def _urls(args: argparse.Namespace) -> list[str]:
    try:
        return worker_urls(args.url or [env.url() or DEFAULT_URL])
    except ValueError as error:
        raise AdminError(f"--url: {error}") from error


def _call(method: str, url: str, path: str, **kwargs) -> dict:
    try:
        response = requests.request(method, f"{url}{path}", timeout=TIMEOUT_S, **kwargs)
    except requests.ConnectionError as error:
        raise AdminError(f"--url {url}: cannot connect (is the server running?)") from error
    if response.status_code >= 400:
        try:  # SGLang's app puts an error's text in "message"
            body = response.json()
            detail = body.get("message") or body.get("detail") or response.text
        except ValueError:
            detail = response.text
        raise AdminError(f"{method} {url}{path}: {response.status_code} {detail}")
    return response.json()


def run_stats(args: argparse.Namespace) -> int:
    return _report(lambda: _stats(args))


def run_config(args: argparse.Namespace) -> int:
    return _report(lambda: _config(args))


def _report(command) -> int:
    try:
        command()
    except AdminError as error:
        print(f"nanospec: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0


def _stats(args: argparse.Namespace) -> None:
    if args.limit < 1:
        raise AdminError("--limit: must be at least 1")
    if args.watch is not None and args.watch <= 0:
        raise AdminError("--watch: must be a positive number of seconds")
    urls = _urls(args)
    params = {"limit": args.limit} | ({"state": args.state} if args.state else {})
    while True:
        if len(urls) == 1:
            table = format_stats(_call("GET", urls[0], "/stats/vocab", params=params))
        else:
            fleet = fetch_fleet(urls, partial(_call, "GET", path="/stats/vocab", params=params))
            fleet.requests = fleet.requests[: args.limit]
            errors = [worker.error for worker in fleet.workers if worker.stats is None]
            if len(errors) == len(urls):
                raise AdminError("; ".join(errors))
            table = format_fleet(fleet)
        if args.watch is None:
            print(table)
            if len(urls) > 1 and errors:  # the table shows the rest; the status says so
                raise AdminError("; ".join(errors))
            return
        print("\033[2J\033[H" + table, flush=True)  # clear the terminal, then redraw
        time.sleep(args.watch)


def _config(args: argparse.Namespace) -> None:
    urls = _urls(args)
    body = None
    if args.config_command == "set":
        body = {args.key: setting_value(args.key, args.value)}  # a bad value first, as before
        if not args.admin_key:
            raise AdminError(f"--admin-key: required to change settings (or set ${env.ADMIN_KEY})")
    # Every worker is read first, so that a fleet with one worker down changes none.
    settings = {url: _call("GET", url, "/nanospec/settings") for url in urls}
    if body is not None:
        headers = {ADMIN_KEY_HEADER: args.admin_key}
        for url in urls:
            settings[url] = _call("POST", url, "/nanospec/settings", json=body, headers=headers)
    for url, values in settings.items():
        line = "  ".join(f"{key}={value}" for key, value in values.items())
        print(line if len(urls) == 1 else f"{worker_label(url)}  {line}")


def setting_value(key: str, text: str) -> int | bool:
    if key == "adaptive":
        if text.lower() not in SWITCH_VALUES:
            raise AdminError(f"value: adaptive is on or off, not {text!r}")
        return SWITCH_VALUES[text.lower()]
    try:
        return int(text)
    except ValueError:
        raise AdminError(f"value: {key} is a whole number, not {text!r}") from None


def _adaptive_line(adaptive: dict | None) -> list[str]:
    """The policy in force and what it did (`/stats/vocab`'s ``adaptive``)."""
    if not adaptive:
        return []
    policy = adaptive["policy"]
    if policy == "goodput" and not adaptive["enabled"]:
        policy += " (switched off: launch depth)"
    by_depth = ", ".join(f"{d}: {n}" for d, n in adaptive["steps_by_depth"].items()) or "-"
    line = (
        f"adaptive  policy {policy}   depth now {adaptive['depth_in_force']}   "
        f"steps by depth {{{by_depth}}}"
    )
    if adaptive.get("acceptance_rate") is not None:
        line += f"   acceptance {adaptive['acceptance_rate']:.2f}"
    return [line]


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


COLUMNS = [
    ("rid", 10), ("state", 8), ("rank", 4), ("prompt", 6), ("output", 6), ("w_max", 6),
    ("active", 7), ("mean", 8), ("max", 7), ("coverage", 8), ("accept", 6), ("steps", 6),
]  # fmt: skip
WORKER_COLUMN = ("worker", 21)


def _aggregate_lines(agg: dict) -> list[str]:
    saved = agg["lm_head_rows_saved_fraction"]
    return [
        f"requests  {agg['requests_running']} running, {agg['requests_finished']} finished, "
        f"{agg['requests_aborted']} aborted   "
        f"tokens {agg['prompt_tokens']} prompt / {agg['output_tokens']} output",
        f"means     active vocab {_fmt(agg['active_vocab_mean'], 1)}   "
        f"coverage {_fmt(agg['coverage_mean'], 3)}   accept length "
        f"{_fmt(agg['accept_length_mean'])}   LM-head rows saved "
        f"{'-' if saved is None else f'{saved:.1%}'}   state {agg['state_bytes'] / 2**20:.1f} MiB",
    ]


def _request_lines(requests: list[dict], by_worker: bool = False) -> list[str]:
    columns = [WORKER_COLUMN, *COLUMNS] if by_worker else COLUMNS
    lines = [" ".join(f"{name:>{width}}" for name, width in columns)]
    for entry in requests:
        cells = [
            entry["rid"][:10], entry["state"], entry["dp_rank"], entry["prompt_tokens"],
            entry["output_tokens"], entry["w_max"], entry["active_vocab_size"],
            _fmt(entry["active_vocab_mean"], 1), entry["active_vocab_max"],
            _fmt(entry["coverage"], 3), _fmt(entry["accept_length_mean"]), entry["draft_steps"],
        ]  # fmt: skip
        cells = [entry["worker"], *cells] if by_worker else cells
        lines.append(" ".join(f"{_fmt(c):>{w}}" for c, (_, w) in zip(cells, columns, strict=True)))
    if not requests:
        lines.append("(no requests yet)")
    return lines


def format_stats(stats: dict) -> str:
    """`/stats/vocab` as a terminal table: settings, aggregates, then one row per request."""
    settings = stats["settings"]
    lines = [
        "settings  " + "  ".join(f"{k}={v}" for k, v in settings.items()),
        *_aggregate_lines(stats["aggregates"]),
        *_adaptive_line(stats.get("adaptive")),
        "",
        *_request_lines(stats["requests"]),
    ]
    started = datetime.fromtimestamp(stats["started_at"]).strftime("%Y-%m-%d %H:%M:%S")
    lines.append(f"\nsince {started}; history keeps {stats['history_size']} finished per rank")
    return "\n".join(lines)


def format_fleet(fleet: FleetStats) -> str:
    """Several workers: the fleet's sums, one line per worker (and DP rank), then requests."""
    answered = sum(worker.stats is not None for worker in fleet.workers)
    lines = [f"fleet     {answered} of {len(fleet.workers)} workers answered"]
    lines += _aggregate_lines(fleet.aggregates.model_dump())
    lines += ["", f"{'worker':>21} {'rank':>4} {'w_max':>6} {'running':>7} {'finished':>8} "
              f"{'aborted':>7} {'output':>7} {'accept':>6} {'coverage':>8} {'rows saved':>10}"]  # fmt: skip
    for worker in fleet.workers:
        if worker.stats is None:
            lines.append(f"{worker.worker:>21} {'-':>4} unreachable: {worker.error}")
            continue
        rows = [("all", worker.stats.settings, worker.stats.aggregates)]
        if len(worker.stats.ranks) > 1:
            rows += [(rank.dp_rank, rank.settings, rank.aggregates) for rank in worker.stats.ranks]
        for rank, settings, agg in rows:
            saved = agg.lm_head_rows_saved_fraction
            lines.append(
                f"{worker.worker:>21} {rank:>4} {settings.w_max:>6} {agg.requests_running:>7} "
                f"{agg.requests_finished:>8} {agg.requests_aborted:>7} {agg.output_tokens:>7} "
                f"{_fmt(agg.accept_length_mean):>6} {_fmt(agg.coverage_mean, 3):>8} "
                f"{'-' if saved is None else f'{saved:.1%}':>10}"
            )
    requests = [entry.model_dump(mode="json") for entry in fleet.requests]
    return "\n".join([*lines, "", *_request_lines(requests, by_worker=True)])
