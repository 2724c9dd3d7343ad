"""Static checks of the Docker and compose files (no Docker daemon runs on the CI host):
they parse, the entry point is a real `nanospec serve` command line of ours, and the
compose files have the expected service, volume, secret, health check and GPU reservation."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser

from nanospec_server.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = ["Dockerfile", "Dockerfile.cpu"]
COMPOSE = {"deploy/compose.yaml": "Dockerfile", "deploy/compose.cpu.yaml": "Dockerfile.cpu"}
SAMPLE_ENV = {
    "NANOSPEC_PORT": "30000", "NANOSPEC_MODE": "nanospec", "NANOSPEC_W_MAX": "2048",
    "NANOSPEC_K_PRE": "3", "NANOSPEC_K_VER": "3",
}  # fmt: skip


def instructions(name: str) -> dict[str, list[str]]:
    parser = DockerfileParser(fileobj=(ROOT / name).open("rb"))
    found: dict[str, list[str]] = {}
    for instruction in parser.structure:
        found.setdefault(instruction["instruction"], []).append(instruction["value"])
    return found


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dockerfile_runs_nanospec_serve_as_a_user_with_a_health_check(name: str) -> None:
    found = instructions(name)
    assert len(found["FROM"]) == 1
    assert found["USER"] == ["nanospec"]
    assert any("/health" in value for value in found["HEALTHCHECK"])
    assert "/models" in found["VOLUME"][0]
    env = " ".join(found["ENV"])
    assert "NANOSPEC_CACHE=/models" in env
    for variable in SAMPLE_ENV:
        assert f"{variable}=" in env, variable

    entrypoint = yaml.safe_load(found["ENTRYPOINT"][0])  # exec form: a JSON list
    assert entrypoint[:2] == ["/bin/sh", "-c"]
    script = entrypoint[2]
    for variable, value in SAMPLE_ENV.items():
        script = script.replace(f'"${variable}"', value)
    argv = shlex.split(script.replace('"$@"', "--model-path /models/m"))
    assert argv[:3] == ["exec", "nanospec", "serve"]
    args, sglang_rest = build_parser().parse_known_args(argv[2:])
    assert args.command == "serve" and args.nanospec_w_max == 2048
    assert sglang_rest == ["--host", "0.0.0.0", "--port", "30000", "--model-path", "/models/m"]


def test_cpu_image_uses_the_cpu_install_script() -> None:
    runs = " ".join(instructions("Dockerfile.cpu")["RUN"])
    assert "deploy/install_cpu.sh" in runs and (ROOT / "deploy/install_cpu.sh").is_file()


def test_cpu_image_takes_its_base_and_build_time_pip_config_as_arguments() -> None:
    """deploy/image/build.sh builds FROM a base of its own and hands pip a configuration for
    the build only: a build argument, never part of the image's environment."""
    found = instructions("Dockerfile.cpu")
    assert found["FROM"] == ["${BASE_IMAGE}"]
    assert "BASE_IMAGE=python:3.11-slim-bookworm" in found["ARG"]  # what `docker build` gets
    assert "PIP_CONFIG_FILE" in found["ARG"]
    assert "PIP_CONFIG_FILE" not in " ".join(found["ENV"])


@pytest.mark.parametrize(("name", "dockerfile"), COMPOSE.items())
def test_compose_file(name: str, dockerfile: str) -> None:
    compose = yaml.safe_load((ROOT / name).read_text())
    service = compose["services"]["nanospec"]
    build = service["build"]
    assert (ROOT / "deploy" / build["context"] / build["dockerfile"]).resolve() == ROOT / dockerfile
    assert service["ports"] == ["127.0.0.1:30000:30000"]  # this host only, by default
    assert "models:/models" in service["volumes"] and "models" in compose["volumes"]
    assert service["secrets"] == ["admin_key"] and "admin_key" in compose["secrets"]
    assert service["environment"]["NANOSPEC_ADMIN_KEY_FILE"] == "/run/secrets/admin_key"
    assert "/health" in " ".join(service["healthcheck"]["test"])
    devices = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    gpu = any("gpu" in d["capabilities"] for d in devices.get("devices", []))
    assert gpu == (dockerfile == "Dockerfile")


FLEETS = {
    "deploy/compose.fleet.yaml": "Dockerfile",
    "deploy/compose.fleet.cpu.yaml": "Dockerfile.cpu",
}


@pytest.mark.parametrize(("name", "dockerfile"), FLEETS.items())
def test_fleet_compose_file(name: str, dockerfile: str) -> None:
    """N replicas of one image and key behind a router that names each of them; every port
    on this host only; on a GPU host each replica has a GPU of its own."""
    from sglang_router.launch_router import parse_router_args

    compose = yaml.safe_load((ROOT / name).read_text())
    services = compose["services"]
    router = services.pop("router")
    assert len(services) >= 2 and all(name.startswith("worker-") for name in services)
    gpus = []
    for worker_name, worker in services.items():
        build = worker["build"]
        path = ROOT / "deploy" / build["context"] / build["dockerfile"]
        assert path.resolve() == ROOT / dockerfile
        assert worker["image"] == router["image"] and worker["build"] == router["build"]
        assert worker["hostname"] == worker_name  # the `worker` label of its series
        assert worker["secrets"] == ["admin_key"] and "admin_key" in compose["secrets"]
        assert worker["environment"]["NANOSPEC_ADMIN_KEY_FILE"] == "/run/secrets/admin_key"
        assert "/health" in " ".join(worker["healthcheck"]["test"])
        assert "models:/models" in worker["volumes"] and "models" in compose["volumes"]
        [port] = worker["ports"]
        assert port.startswith("127.0.0.1:") and port.endswith(":30000")
        devices = worker.get("deploy", {}).get("resources", {}).get("reservations", {})
        gpus += [tuple(d["device_ids"]) for d in devices.get("devices", [])]
    assert len(set(gpus)) == (len(services) if dockerfile == "Dockerfile" else 0)

    assert router["entrypoint"] == ["python3", "-m", "sglang_router.launch_router"]
    args = parse_router_args(router["command"])  # the router's own parser
    assert args.worker_urls == [f"http://{worker}:30000" for worker in services]
    assert args.policy in ("cache_aware", "round_robin") and args.port == 30000
    assert router["ports"] == ["127.0.0.1:30000:30000"]
    assert {w: c["condition"] for w, c in router["depends_on"].items()} == dict.fromkeys(
        services, "service_healthy"
    )
    published = [worker["ports"][0] for worker in services.values()] + router["ports"]
    assert len({port.split(":")[1] for port in published}) == len(published)
