"""One real `nanospec serve` (tiny models, SGLang's scheduler, EAGLE) shared by tests/admin."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from nanospec_server.launch.server import running_server, speculative_flags
from nanospec_server.models.tiny import tiny_model_path
from tests.serving.conftest import ADMIN_KEY, BASE_FLAGS

SPEC_FLAGS = speculative_flags("EAGLE", "tiny-eagle", 3, 1, 4)


@dataclass
class Server:
    url: str
    log: Path

    def settings(self, headers: dict[str, str] | None = None, **body) -> requests.Response:
        return requests.post(
            f"{self.url}/nanospec/settings", json=body, headers=headers, timeout=60
        )

    def stats(self, **params) -> dict:
        response = requests.get(f"{self.url}/stats/vocab", params=params, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()


ADMIN = {"X-Admin-Key": ADMIN_KEY}


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("admin-server") / "server.log"
    model = ["--model-path", str(tiny_model_path("tiny-target"))]
    flags = model + BASE_FLAGS + SPEC_FLAGS + ["--enable-metrics"]
    with running_server(flags, log) as url:
        yield Server(url, log)
