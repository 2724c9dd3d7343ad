"""`nanospec serve` as a user runs it: the offline default answers, bad flags are named."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

from nanospec_server.launch.server import running_server

BAD_FLAGS = [
    (["--nanospec-mode", "bogus"], "--nanospec-mode"),
    (["--nanospec-w-max", "0"], "--nanospec-w-max"),
    (["--nanospec-w-max", "64", "--nanospec-w-cap", "32"], "w_cap"),
    (["--nanospec-mode", "static"], "--speculative-token-map"),
    (["--speculative-use-rejection-sampling"], "--speculative-use-rejection-sampling"),
    (["--tp-size", "2", "--speculative-algorithm", "EAGLE3"], "--tp-size"),
    (["--tokenizer-worker-num", "2"], "--tokenizer-worker-num"),
    (["--no-nanospec-adaptive", "--nanospec-adaptive-keep-extend"],
     "--nanospec-adaptive-keep-extend"),
    (["--nanospec-adaptive", "--speculative-adaptive"], "--nanospec-adaptive"),
    (["--nanospec-adaptive", "--nanospec-adaptive-policy", "bogus"], "--nanospec-adaptive-policy"),
    (["--no-nanospec-adaptive", "--nanospec-adaptive-policy", "fixed"],
     "--nanospec-adaptive-policy"),
    (["--nanospec-adaptive-calibration", "/nonexistent.json"], "--nanospec-adaptive-calibration"),
    (["--no-nanospec-adaptive", "--nanospec-adaptive-calibration", "c.json"],
     "--nanospec-adaptive-calibration"),
]  # fmt: skip


def test_the_embedded_pair_on_a_cpu_drafts_with_the_hybrid_prior(monkeypatch) -> None:
    from nanospec_server import cli, host

    parser = cli.build_parser()

    def prior_of(*argv: str, cuda: bool = False) -> int:
        monkeypatch.setattr(host, "has_cuda", lambda: cuda)
        args, rest = parser.parse_known_args(["serve", *argv])
        return cli._default_prior_k(args, rest)

    assert prior_of() == 2048
    assert prior_of(cuda=True) == 0
    assert prior_of("--tiny") == 0
    assert prior_of("--model-path", "m") == 0
    args, _ = parser.parse_known_args(["serve", "--nanospec-prior-k", "0"])
    assert args.nanospec_prior_k == 0  # a value given is kept


def test_adaptive_speculation_is_on_by_default_for_a_speculative_cpu_server(monkeypatch) -> None:
    from nanospec_server import cli, host

    parser = cli.build_parser()

    def adaptive_of(*argv: str, cuda: bool = False) -> tuple[bool, bool]:
        monkeypatch.setattr(host, "has_cuda", lambda: cuda)
        args, rest = parser.parse_known_args(["serve", *argv])
        cli._resolve_adaptive(args, rest)
        return args.nanospec_adaptive, args.adaptive_by_default

    spec = ("--model-path", "m", "--speculative-algorithm", "EAGLE")
    assert adaptive_of() == (True, True)  # the embedded default pair
    assert adaptive_of("--tiny") == (True, True)
    assert adaptive_of(*spec) == (True, True)
    assert adaptive_of("--model-path", "m") == (False, True)  # plain decoding
    assert adaptive_of(*spec, cuda=True) == (False, True)  # not measured on a GPU yet
    assert adaptive_of(*spec, "--speculative-adaptive") == (False, True)  # SGLang's policy
    assert adaptive_of(*spec, "--no-nanospec-adaptive") == (False, False)
    assert adaptive_of(*spec, "--nanospec-adaptive", cuda=True) == (True, False)


@pytest.mark.parametrize(("flags", "named"), BAD_FLAGS)
def test_bad_flags_fail_fast_naming_the_flag(flags: list[str], named: str) -> None:
    command = [sys.executable, "-m", "nanospec_server.cli", "serve", *flags]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert named in done.stderr, done.stderr


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_tiny_default_serves_text_and_chat(tmp_path) -> None:
    flags = ["--tiny", "--mem-fraction-static", "0.3"]
    with running_server(flags, tmp_path / "server.log") as url:
        text = {"text": "The cat sat", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        answer = requests.post(f"{url}/generate", json=text, timeout=120).json()
        assert answer["meta_info"]["completion_tokens"] == 8
        assert answer["meta_info"]["nanospec"][-1]["mode"] == "nanospec"
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        reply = requests.post(f"{url}/v1/chat/completions", json=chat, timeout=120).json()
        assert reply["usage"]["completion_tokens"] >= 1
        # served under its own name, not the cache folder it was built into
        models = requests.get(f"{url}/v1/models", timeout=30).json()["data"]
        assert [m["id"] for m in models] == ["tiny-target"]
        adaptive = requests.get(f"{url}/stats/vocab", timeout=30).json()["adaptive"]
        assert adaptive["policy"] == "goodput" and adaptive["enabled"]  # on by default
        assert adaptive["plain_depth_0"] is True
        config = requests.get(f"{url}/nanospec/config", timeout=30).json()
        launched = {"mode": "nanospec", "w_max": 3072, "w_cap": 3072, "k_pre": 3, "k_ver": 3}
        assert {key: config[key] for key in launched} == launched
        assert config["prior_k"] == 0 and config["union_capacity"] is None  # the defaults
        bad = requests.post(f"{url}/generate", json={"input_ids": [10**9]}, timeout=60)
        assert 400 <= bad.status_code < 500
        # the bad request did not take the server down
        again = requests.post(f"{url}/generate", json=text, timeout=120).json()
        assert again["output_ids"] == answer["output_ids"]
    log = (tmp_path / "server.log").read_text()
    assert "nanospec: ready at" in log and "nanospec: stopped" in log
    # --skip-server-warmup can race SGLang's post-warmup /freeze_gc against uvicorn's bind
    assert "freeze_gc failed" not in log and "freeze_gc skipped" not in log
