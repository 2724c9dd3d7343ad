"""deploy/image/pip_build_config.py: the host's pip settings moved under /mnt/host, with
a read-only mount for each path they name and its mount point made outside the image."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "image" / "pip_build_config.py"


def run_helper(
    tmp_path: Path, config: str
) -> tuple[list[tuple[str, str]], configparser.ConfigParser]:
    """Run the helper with `config` as the host's PIP_CONFIG_FILE (the machine's own
    config files still apply, as they would for a build); return mounts and staged config."""
    (tmp_path / "host.conf").write_text(config)
    stage = tmp_path / "stage"
    stage.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=str(tmp_path / "host.conf"), PIP_DEFAULT_TIMEOUT="77")
    printed = subprocess.run(
        [sys.executable, str(SCRIPT), str(stage)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    mounts = []
    for option in printed:
        assert option.startswith("--volume=") and option.endswith(":ro"), option
        source, target, _ = option.removeprefix("--volume=").split(":")
        mounts.append((source, target))
    staged = configparser.ConfigParser()
    staged.read(stage / "pip.conf")
    return mounts, staged


def moved(path: Path) -> str:
    """Where the build sees a host path."""
    return f"/mnt/host{path}"


def test_local_paths_move_under_mnt_and_are_mounted_read_only(tmp_path: Path) -> None:
    index = tmp_path / "pypi" / "simple"
    index.mkdir(parents=True)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    bundle = tmp_path / "ca.crt"
    bundle.write_text("not a real certificate\n")
    mounts, staged = run_helper(
        tmp_path,
        f"[global]\ncert = {bundle}\nfind-links = {wheels}\n"
        f"extra-index-url = {index.as_uri()} https://example.org/simple\n"
        "timeout = 30\n",
    )
    stage = tmp_path / "stage"
    assert mounts[0] == (str(stage), "/mnt")
    by_source = dict(mounts[1:])
    # the index's parent travels with it: its pages link to files beside it
    assert by_source[str(index.parent)] == moved(index.parent)
    assert by_source[str(wheels)] == moved(wheels)
    assert by_source[str(bundle)] == moved(bundle)

    settings = staged["global"]
    assert settings["cert"] == moved(bundle)
    assert settings["find-links"] == moved(wheels)
    assert settings["extra-index-url"].split() == [
        Path(moved(index)).as_uri(),
        "https://example.org/simple",  # not a local path: unchanged
    ]
    assert settings["timeout"] == "30" and settings["default-timeout"] == "77"  # PIP_* too

    # every mount point already exists in the stage, as a folder or a file like its source,
    # so the runtime creates none inside the image
    for source, target in mounts[1:]:
        mount_point = stage / Path(target).relative_to("/mnt")
        assert mount_point.is_dir() == Path(source).is_dir() and mount_point.exists(), target
    # and nothing is mounted twice
    sources = [Path(source) for source, _ in mounts[1:]]
    assert not any(a != b and a in b.parents for a in sources for b in sources)


def test_missing_paths_are_left_alone(tmp_path: Path) -> None:
    absent = tmp_path / "no-such-folder"
    mounts, staged = run_helper(tmp_path, f"[global]\nfind-links = {absent}\n")
    assert staged["global"]["find-links"] == str(absent)
    assert str(absent) not in dict(mounts[1:])
