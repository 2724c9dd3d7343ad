"""`nanospec stats` and `nanospec config` as a user runs them: errors name the flag,
and against the real server the table and the settings change work."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nanospec_server.launch.server import free_port
from tests.admin.conftest import Server
from tests.serving.conftest import ADMIN_KEY


def nanospec(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "NANOSPEC_ADMIN_KEY"}
    command = [sys.executable, "-m", "nanospec_server.cli", *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=base | (env or {})
    )


DEAD_URL = f"http://127.0.0.1:{free_port()}"
BAD_COMMANDS = [
    (["stats", "--url", "localhost:30000"], "--url"),
    (["stats", "--url", f"{DEAD_URL},localhost:30000"], "--url"),  # one of a fleet
    (["stats", "--url", DEAD_URL, "--url", DEAD_URL.replace("http", "https")], "--url"),
    (["config", "set", "w_max", "64", "--url", f"{DEAD_URL},x", "--admin-key", "k"], "--url"),
    (["stats", "--url", DEAD_URL], "--url"),
    (["stats", "--url", DEAD_URL, "--limit", "0"], "--limit"),
    (["stats", "--url", DEAD_URL, "--watch", "-1"], "--watch"),
    (["stats", "--state", "bogus"], "--state"),
    (["config", "get", "--url", DEAD_URL], "--url"),
    (["config", "set", "w_min", "5"], "key"),
    (["config", "set", "w_max", "big"], "value"),
    (["config", "set", "w_max", "64", "--url", DEAD_URL], "--admin-key"),
]


@pytest.mark.parametrize(("args", "named"), BAD_COMMANDS)
def test_errors_name_the_flag(args: list[str], named: str) -> None:
    done = nanospec(*args)
    assert done.returncode != 0 and named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.engine
@pytest.mark.timeout(300)
def test_stats_and_config_against_the_server(server: Server) -> None:
    from nanospec_server.launch.server import generate

    generate(server.url, [1, 7, 8, 9], 6)
    table = nanospec("stats", "--url", server.url, "--limit", "3")
    assert table.returncode == 0, table.stderr
    assert "settings  mode=nanospec" in table.stdout and "coverage" in table.stdout
    assert " finished " in table.stdout  # a request row

    before = nanospec("config", "get", "--url", server.url)
    assert before.returncode == 0 and "w_max=" in before.stdout
    wrong = nanospec("config", "set", "w_max", "640", "--url", server.url, "--admin-key", "nope")
    assert wrong.returncode == 1 and "403" in wrong.stderr
    right = nanospec(
        "config", "set", "w_max", "640", "--url", server.url, env={"NANOSPEC_ADMIN_KEY": ADMIN_KEY}
    )
    assert right.returncode == 0 and "w_max=640" in right.stdout, right.stderr
    too_big = nanospec(
        "config", "set", "w_max", "99999", "--url", server.url, "--admin-key", ADMIN_KEY
    )
    assert too_big.returncode == 1 and "w_max" in too_big.stderr
    w_max = before.stdout.split("w_max=")[1].split()[0]
    nanospec("config", "set", "w_max", w_max, "--url", server.url, "--admin-key", ADMIN_KEY)


def test_adaptive_values_and_the_stats_line() -> None:
    from nanospec_server.admin.cli import AdminError, _adaptive_line, setting_value

    assert setting_value("adaptive", "off") is False and setting_value("adaptive", "ON") is True
    assert setting_value("w_max", "640") == 640
    for key, bad in (("adaptive", "maybe"), ("w_max", "lots")):
        with pytest.raises(AdminError, match=key):
            setting_value(key, bad)
    assert _adaptive_line(None) == []
    published = {"policy": "goodput", "enabled": False, "depth_in_force": 3,
                 "steps_by_depth": {"0": 41, "3": 7}, "acceptance_rate": 0.625}  # fmt: skip
    (line,) = _adaptive_line(published)
    assert line.startswith("adaptive  policy goodput (switched off: launch depth)   depth now 3")
    assert "steps by depth {0: 41, 3: 7}" in line and "acceptance 0.62" in line
    off = {"policy": "off", "enabled": False, "depth_in_force": 4, "steps_by_depth": {"4": 9}}
    assert _adaptive_line(off) == ["adaptive  policy off   depth now 4   steps by depth {4: 9}"]
