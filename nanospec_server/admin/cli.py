"""`nanospec stats [--watch] [--url]` and `nanospec config get|set`: a running server's admin API.

Wire into the main parser with `add_admin_commands(subparsers)`; each command stores its
runner in `args.func`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime
from urllib.parse import urlparse

import requests

from nanospec_server.admin.auth import ADMIN_KEY_ENV, ADMIN_KEY_HEADER

URL_ENV = "NANOSPEC_URL"
DEFAULT_URL = "http://127.0.0.1:30000"
SETTINGS = ("w_max", "k_pre", "k_ver", "adaptive")
SWITCH_VALUES = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}
TIMEOUT_S = 30


class AdminError(Exception):
    """A failure the user can act on; printed as one line."""


def add_admin_commands(subparsers: argparse._SubParsersAction) -> None:
    url_help = f"server URL (default: ${URL_ENV} or {DEFAULT_URL})"
    stats = subparsers.add_parser(
        "stats", help="per-request NanoSpec statistics of a running server, as a table"
    )
    stats.add_argument("--url", default=os.environ.get(URL_ENV, DEFAULT_URL), help=url_help)
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
    get.add_argument("--url", default=os.environ.get(URL_ENV, DEFAULT_URL), help=url_help)
    get.set_defaults(func=run_config)
    put = actions.add_parser("set", help="change one setting live (needs the admin key)")
    put.add_argument("key", choices=SETTINGS, help="the setting")
    put.add_argument("value", help="its new value (adaptive: on or off)")
    put.add_argument("--url", default=os.environ.get(URL_ENV, DEFAULT_URL), help=url_help)
    put.add_argument(
        "--admin-key", default=os.environ.get(ADMIN_KEY_ENV),
        help=f"the server's --admin-api-key (default: ${ADMIN_KEY_ENV})",
    )  # fmt: skip
    put.set_defaults(func=run_config)


def _check_url(url: str) -> str:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise AdminError(f"--url: not an http(s) URL: {url!r}")
    return url.rstrip("/")


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
        raise AdminError(f"{method} {path}: {response.status_code} {detail}")
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
    url = _check_url(args.url)
    params = {"limit": args.limit} | ({"state": args.state} if args.state else {})
    while True:
        table = format_stats(_call("GET", url, "/stats/vocab", params=params))
        if args.watch is None:
            print(table)
            return
        print("\033[2J\033[H" + table, flush=True)  # clear the terminal, then redraw
        time.sleep(args.watch)


def _config(args: argparse.Namespace) -> None:
    url = _check_url(args.url)
    if args.config_command == "get":
        settings = _call("GET", url, "/nanospec/settings")
    else:
        body = {args.key: setting_value(args.key, args.value)}  # a bad value first, as before
        if not args.admin_key:
            raise AdminError(f"--admin-key: required to change settings (or set ${ADMIN_KEY_ENV})")
        headers = {ADMIN_KEY_HEADER: args.admin_key}
        settings = _call("POST", url, "/nanospec/settings", json=body, headers=headers)
    print("  ".join(f"{key}={value}" for key, value in settings.items()))


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


def format_stats(stats: dict) -> str:
    """`/stats/vocab` as a terminal table: settings, aggregates, then one row per request."""
    settings, agg = stats["settings"], stats["aggregates"]
    saved = agg["lm_head_rows_saved_fraction"]
    lines = [
        "settings  " + "  ".join(f"{k}={v}" for k, v in settings.items()),
        f"requests  {agg['requests_running']} running, {agg['requests_finished']} finished, "
        f"{agg['requests_aborted']} aborted   "
        f"tokens {agg['prompt_tokens']} prompt / {agg['output_tokens']} output",
        f"means     active vocab {_fmt(agg['active_vocab_mean'], 1)}   "
        f"coverage {_fmt(agg['coverage_mean'], 3)}   accept length "
        f"{_fmt(agg['accept_length_mean'])}   LM-head rows saved "
        f"{'-' if saved is None else f'{saved:.1%}'}   state {agg['state_bytes'] / 2**20:.1f} MiB",
        *_adaptive_line(stats.get("adaptive")),
        "",
        " ".join(f"{name:>{width}}" for name, width in COLUMNS),
    ]
    for entry in stats["requests"]:
        cells = [
            entry["rid"][:10], entry["state"], entry["dp_rank"], entry["prompt_tokens"],
            entry["output_tokens"], entry["w_max"], entry["active_vocab_size"],
            _fmt(entry["active_vocab_mean"], 1), entry["active_vocab_max"],
            _fmt(entry["coverage"], 3), _fmt(entry["accept_length_mean"]), entry["draft_steps"],
        ]  # fmt: skip
        lines.append(" ".join(f"{_fmt(c):>{w}}" for c, (_, w) in zip(cells, COLUMNS, strict=True)))
    if not stats["requests"]:
        lines.append("(no requests yet)")
    started = datetime.fromtimestamp(stats["started_at"]).strftime("%Y-%m-%d %H:%M:%S")
    lines.append(f"\nsince {started}; history keeps {stats['history_size']} finished per rank")
    return "\n".join(lines)
