"""The CPU image built and served: `deploy/image/build.sh` makes a Debian base and
Dockerfile.cpu's image with podman, and the container then serves the tiny models to the
README's curls, the dashboard and the admin key, as a user would reach them.

About half an hour on a loaded 2-core host and 8 GB of disk, in a podman store of its own
that is deleted afterwards, so it runs only with NANOSPEC_IMAGE_TEST=1 (root, podman, runc and debootstrap needed):

    NANOSPEC_IMAGE_TEST=1 python -m pytest -s tests/admin/test_image.py

CI installs no podman, so there it skips, and tests/admin/test_deploy.py checks the files
statically.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from nanospec_server.launch.server import free_port

ROOT = Path(__file__).resolve().parents[2]
IMAGE_DIR = ROOT / "deploy" / "image"
TAG = "localhost/nanospec-server:cpu-test"
BASE_TAG = "localhost/nanospec-base:bookworm-test"
ADMIN_KEY = "image-test-key"
BUILD_TIMEOUT_S = 3600  # about 5 minutes on an idle 2-core host, far more on a loaded one
START_TIMEOUT_S = 900  # the image's own health check allows 900 s before it counts failures
REQUEST_TIMEOUT_S = 300
# Where pip inside the image would find a configuration (root's, the user's, the venv's).
PIP_CONFIG_PATHS = [
    "/etc/pip.conf", "/etc/xdg/pip", "/root/.config/pip", "/root/.pip",
    "/home/nanospec/.config/pip", "/opt/venv/pip.conf",
]  # fmt: skip

pytestmark = [pytest.mark.engine, pytest.mark.timeout(BUILD_TIMEOUT_S + 2 * START_TIMEOUT_S)]


def why_not_here() -> str | None:
    """Why this host cannot build and run the image, or None."""
    missing = [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install podman runc debootstrap)"
    if os.geteuid() != 0:
        return "needs root: debootstrap, and podman running containers without user namespaces"
    if os.environ.get("NANOSPEC_IMAGE_TEST") != "1":
        return "builds an 8 GB image in 5+ minutes: set NANOSPEC_IMAGE_TEST=1 to run it"
    return None


@dataclass
class Podman:
    """podman with this repository's containers.conf and a store of its own."""

    env: dict[str, str]

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )


@pytest.fixture(scope="module")
def podman() -> Iterator[Podman]:
    if reason := why_not_here():
        pytest.skip(reason)
    store = Path(tempfile.mkdtemp(prefix="nanospec-image-test-", dir="/var/tmp"))
    (store / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\ngraphroot = "{store}/graph"\nrunroot = "{store}/run"\n'
    )
    env = dict(
        os.environ,
        CONTAINERS_CONF=str(IMAGE_DIR / "containers.conf"),
        CONTAINERS_STORAGE_CONF=str(store / "storage.conf"),
    )
    tool = Podman(env)
    probe = tool("info")
    if probe.returncode != 0:
        shutil.rmtree(store)
        pytest.skip(f"podman cannot run here: {probe.stderr.strip()[-500:]}")
    try:
        yield tool
    finally:
        # With no container left nothing in the store is mounted, and the images go with it.
        tool("rm", "--all", "--force", "--volumes", timeout=600)
        shutil.rmtree(store, ignore_errors=True)


@pytest.fixture(scope="module")
def image(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> str:
    log = tmp_path_factory.mktemp("image") / "build.log"
    started = time.monotonic()
    with log.open("w") as out:
        # nice: the host is shared, and a build would take its cores from running servers.
        build = subprocess.run(
            ["nice", "-n", "19", "bash", str(IMAGE_DIR / "build.sh"), TAG],
            env=dict(podman.env, BASE_TAG=BASE_TAG, PYTHON=sys.executable),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=BUILD_TIMEOUT_S,
        )
    output = log.read_text()
    assert build.returncode == 0, f"build failed ({log}):\n{output[-4000:]}"
    size = podman("image", "inspect", "--format", "{{.Size}}", TAG).stdout.strip()
    steps = "; ".join(re.findall(r"^.* built in \d+ s$", output, flags=re.M))
    print(f"\nbuilt in {time.monotonic() - started:.0f} s ({steps}), {int(size) / 1e9:.1f} GB")
    return TAG


@pytest.fixture(scope="module")
def served(podman: Podman, image: str) -> Iterator[str]:
    """The base URL of the image serving the tiny models, the admin key set."""
    port = free_port()
    name = f"nanospec-image-test-{os.getpid()}"
    run = podman(
        "run", "--detach", "--name", name, "--publish", f"127.0.0.1:{port}:30000",
        "--env", f"NANOSPEC_ADMIN_KEY={ADMIN_KEY}", image, "--tiny",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    try:
        url = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        wait_until_healthy(podman, name, url)
        print(f"\n/health answered 200 {time.monotonic() - started:.0f} s after podman run")
        # Nothing runs the image's HEALTHCHECK without systemd; run it once to show it works.
        check = podman("healthcheck", "run", name)
        assert check.returncode == 0, check.stdout + check.stderr
        yield url
    finally:
        log = container_log(podman, name)
        podman("rm", "--force", "--volumes", "--time", "10", name)
        print(f"container log, last lines:\n{log[-2000:]}")


def container_log(podman: Podman, name: str) -> str:
    logs = podman("logs", name)
    return logs.stdout + logs.stderr


def wait_until_healthy(podman: Podman, name: str, url: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        state = podman("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
        if state != "running":
            pytest.fail(f"container is {state}:\n{container_log(podman, name)[-4000:]}")
        try:
            if requests.get(f"{url}/health", timeout=10).status_code == 200:
                return
        except requests.ConnectionError:
            pass  # the port is published before the server listens
        time.sleep(2)
    pytest.fail(f"no /health in {START_TIMEOUT_S} s:\n{container_log(podman, name)[-4000:]}")


def readme_curls() -> list[str]:
    """The curl commands of the README's quick start, continuation lines joined."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    quick_start = next(block for block in blocks if "curl -s localhost:30000/" in block)
    commands = quick_start.replace("\\\n", " ").splitlines()
    return [command for command in commands if command.startswith("curl ")]


def test_readme_curls_are_answered(served: str) -> None:
    curls = readme_curls()
    assert {c.split()[2].split("/", 1)[1] for c in curls} == {"v1/chat/completions", "generate"}
    for command in curls:
        argv = shlex.split(command.replace("localhost:30000", served.removeprefix("http://")))
        done = subprocess.run(
            [*argv, "--max-time", str(REQUEST_TIMEOUT_S), "--fail-with-body"],
            capture_output=True,
            text=True,
            timeout=REQUEST_TIMEOUT_S + 30,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
        answer = json.loads(done.stdout)
        if "/v1/chat/completions" in command:
            assert answer["usage"]["completion_tokens"] > 0, answer
            assert isinstance(answer["choices"][0]["message"]["content"], str), answer
        else:
            assert 0 < answer["meta_info"]["completion_tokens"] <= 32, answer
            assert "nanospec" in answer["meta_info"], answer  # served with NanoSpec on


def test_dashboard_is_served(served: str) -> None:
    response = requests.get(f"{served}/dashboard", timeout=REQUEST_TIMEOUT_S)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")


def test_settings_changes_need_the_key(served: str) -> None:
    settings = f"{served}/nanospec/settings"
    before = requests.get(settings, timeout=REQUEST_TIMEOUT_S).json()
    assert before["w_max"] == 3072  # NANOSPEC_W_MAX, the image's default
    unauthenticated = requests.post(settings, json={"w_max": 1024}, timeout=REQUEST_TIMEOUT_S)
    assert unauthenticated.status_code == 401, unauthenticated.text
    wrong = requests.post(
        settings, json={"w_max": 1024}, headers={"X-Admin-Key": "wrong"}, timeout=REQUEST_TIMEOUT_S
    )
    assert wrong.status_code == 403, wrong.text
    assert requests.get(settings, timeout=REQUEST_TIMEOUT_S).json()["w_max"] == 3072
    changed = requests.post(
        settings,
        json={"w_max": 1024},
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        timeout=REQUEST_TIMEOUT_S,
    )
    assert changed.status_code == 200 and changed.json()["w_max"] == 1024, changed.text
    assert requests.get(settings, timeout=REQUEST_TIMEOUT_S).json()["w_max"] == 1024


def test_image_keeps_no_build_mounts_and_runs_as_its_user(podman: Podman, image: str) -> None:
    """The host's pip configuration, package folders and CA bundle were mounted under /mnt
    at build time only: the image keeps neither them, nor their mount points, nor a pip
    configuration. (A file at a host file's path, such as /etc/ssl/certs/ca-certificates.crt,
    is the image's own: Debian's CA bundle.)"""
    with tempfile.TemporaryDirectory() as stage:
        volumes = subprocess.run(
            [sys.executable, str(IMAGE_DIR / "pip_build_config.py"), stage],
            capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
    host_folders = [
        source
        for source in (v.removeprefix("--volume=").split(":")[0] for v in volumes[1:])
        if Path(source).is_dir()
    ]
    assert host_folders, volumes  # this host's pip names local package folders
    absent = [*host_folders, *PIP_CONFIG_PATHS]
    probe = "; ".join(f"test -e {shlex.quote(p)} && echo present: {shlex.quote(p)}" for p in absent)
    listing = podman(
        "run", "--rm", "--entrypoint", "/bin/sh", image, "-c",
        f"id -un; ls -A /mnt; env | grep '^PIP_'; {probe}; true",
    )  # fmt: skip
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.split() == ["nanospec"], listing.stdout
    inspected = json.loads(podman("image", "inspect", image).stdout)[0]
    environment = inspected["Config"]["Env"]
    assert not any(variable.startswith("PIP_") for variable in environment), environment
    assert "/health" in " ".join(inspected["Healthcheck"]["Test"])  # kept by --format docker
