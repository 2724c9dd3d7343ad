"""Configuration names and the `nanospec serve` flags each one runs with."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nanospec_server.bench.cli import add_bench_command, settings_from
from nanospec_server.bench.configs import Draft, build_configs, drafts_for, full_vocab_reference


def flag(config, name: str) -> str | None:
    flags = list(config.flags)
    return flags[flags.index(name) + 1] if name in flags else None


def test_prior_sizes_make_one_nanospec_config_each_with_its_flag(tmp_path: Path) -> None:
    draft = Draft("STANDALONE", tmp_path)  # an existing directory is taken as the draft
    configs = build_configs([draft], ["full", "nanospec", "sync"], [], [3072, 512], {}, [0, 2048])
    names = [c.name for c in configs]
    assert names == [
        "ar", "standalone-full", "standalone-nanospec", "standalone-nanospec-p2048",
        "standalone-nanospec-w512", "standalone-nanospec-w512-p2048", "standalone-sync",
    ]  # fmt: skip
    by_name = {c.name: c for c in configs}
    assert flag(by_name["standalone-nanospec-p2048"], "--nanospec-prior-k") == "2048"
    assert flag(by_name["standalone-nanospec-w512-p2048"], "--nanospec-w-max") == "512"
    # k = 0 is the paper's method and the server's default: no flag, the plain name.
    assert flag(by_name["standalone-nanospec"], "--nanospec-prior-k") is None
    assert by_name["standalone-nanospec-p2048"].prior_k == 2048
    # The prior applies to NanoSpec only; the ablations keep the paper's window.
    assert flag(by_name["standalone-sync"], "--nanospec-prior-k") is None
    assert full_vocab_reference(configs, by_name["standalone-nanospec-p2048"]) == "standalone-full"
    assert flag(by_name["standalone-full"], "--speculative-algorithm") == "STANDALONE"


def parse(*argv: str):
    parser = argparse.ArgumentParser()
    add_bench_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "run", *argv])
    return settings_from(args, parser)


def test_cli_prior_k_and_the_prior_preset() -> None:
    assert parse("--prior-k", "0", "512", "2048").prior_ks == [0, 512, 2048]
    assert parse().prior_ks == [0]
    preset = parse("--analysis", "prior")
    assert preset.prior_ks == [0, 512, 2048, 8192] and preset.modes == ["full", "nanospec"]
    quick = parse("--quick")
    assert quick.limit_per_task == 1 and quick.max_new_tokens == 32
    assert quick.modes == ["full", "nanospec"]  # ar + 2
    assert "summarization" not in quick.tasks and "rag" not in quick.tasks  # long prefills
    assert parse("--quick", "--max-servers", "2").max_servers == 2  # a flag beats the preset


def test_cli_refuses_a_negative_prior(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse("--prior-k", "-1")
    assert exit_info.value.code == 2 and "--prior-k" in capsys.readouterr().err


def test_several_drafts_and_shapes_get_names_of_their_own(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    drafts = drafts_for("EAGLE", [a, b], [(4, 1, 5), (4, 4, 8)])
    configs = build_configs(drafts, ["full"], [], [3072], {})
    assert [c.name for c in configs] == [
        "ar", "eagle1_4x1x5-full", "eagle1_4x4x8-full", "eagle2_4x1x5-full", "eagle2_4x4x8-full",
    ]  # fmt: skip
    tree = {c.name: c for c in configs}["eagle2_4x4x8-full"]
    assert flag(tree, "--speculative-draft-model-path") == str(b)
    assert flag(tree, "--speculative-eagle-topk") == "4"
    assert [d.label for d in drafts_for("STANDALONE", [a], [(4, 1, 5)])] == ["standalone"]
    assert parse("--shape", "4,1,5", "4,4,8").shapes == [(4, 1, 5), (4, 4, 8)]


@pytest.mark.parametrize("on_gpu", [False, True])
def test_quick_runs_one_server_at_a_time_on_a_cpu(monkeypatch, on_gpu: bool) -> None:
    from nanospec_server import host

    monkeypatch.setattr(host, "has_cuda", lambda: on_gpu)
    quick = parse("--quick")
    if on_gpu:
        assert quick.max_servers is None and quick.max_total_tokens != 4096
    else:
        assert (quick.max_servers, quick.max_total_tokens) == (1, 4096)
    assert parse("--quick", "--tiny").max_servers is None  # tiny servers fit side by side


def test_cpu_report_is_the_documented_run_and_flags_still_win(capsys) -> None:
    report = parse("--cpu-report")
    assert report.target == "qwen2.5-coder-0.5b-instruct" and report.standalone == []
    (head,) = report.eagle
    assert (Path(head) / "config.json").is_file()  # the committed head, found from anywhere
    assert report.modes == ["full", "static", "nanospec", "ctx-only", "ext-only", "sync"]
    assert report.static_ks == [32768, 8192, 2048, 512] and report.prior_ks == [0, 2048]
    assert report.concurrency == [1, 8] and report.max_servers == 1 and report.seed == 1
    assert parse("--cpu-report", "--max-new-tokens", "16").max_new_tokens == 16
    for conflicting in (["--quick"], ["--tiny"], ["--analysis", "wmax"]):
        with pytest.raises(SystemExit):
            parse("--cpu-report", *conflicting)
        assert "--cpu-report" in capsys.readouterr().err


def test_a_tpe_token_map_adds_one_static_config_per_draft(tmp_path: Path) -> None:
    eagle, standalone = Draft("EAGLE", tmp_path), Draft("STANDALONE", tmp_path)
    maps = {32768: tmp_path / "token_map_32k.pt"}
    tpe_map = tmp_path / "trimmed.pt"
    configs = build_configs([eagle, standalone], ["full", "static", "nanospec"], [32768], [3072],
                            maps, [0, 2048], tpe_map)  # fmt: skip
    by_name = {c.name: c for c in configs}
    assert [c.name for c in configs] == [
        "ar", "eagle-full", "eagle-static-32k", "eagle-static-tpe", "eagle-nanospec",
        "eagle-nanospec-p2048", "standalone-full", "standalone-static-32k",
        "standalone-static-tpe", "standalone-nanospec", "standalone-nanospec-p2048",
    ]  # fmt: skip
    tpe = by_name["eagle-static-tpe"]
    assert tpe.mode == "static" and flag(tpe, "--nanospec-mode") == "static"
    assert flag(tpe, "--speculative-token-map") == str(tpe_map)
    assert flag(by_name["eagle-static-32k"], "--speculative-token-map") == str(maps[32768])
    assert full_vocab_reference(configs, tpe) == "eagle-full"
    # without a map, nothing changes
    plain = build_configs([eagle], ["static"], [32768], [3072], maps)
    assert [c.name for c in plain] == ["ar", "eagle-static-32k"]


def test_cli_tpe_token_map(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    trimmed = tmp_path / "trimmed.pt"
    trimmed.write_bytes(b"")
    settings = parse("--tpe-token-map", str(trimmed), "--modes", "full", "static")
    assert settings.tpe_token_map == str(trimmed.resolve())
    assert parse().tpe_token_map is None
    assert parse().digest() == parse().digest()
    for argv, message in ((["--tpe-token-map", str(tmp_path / "missing.pt")], "no such file"),
                          (["--tpe-token-map", str(trimmed), "--modes", "full"], "static")):  # fmt: skip
        with pytest.raises(SystemExit):
            parse(*argv)
        err = capsys.readouterr().err
        assert "--tpe-token-map" in err and message in err


def test_adaptive_twins_every_nanospec_config_and_the_preset(tmp_path: Path) -> None:
    draft = Draft("STANDALONE", tmp_path)
    configs = build_configs([draft], ["full", "nanospec"], [], [3072], {}, [0, 2048], adaptive=True)
    names = [c.name for c in configs]
    assert names == [
        "ar", "standalone-full", "standalone-nanospec", "standalone-nanospec-adaptive",
        "standalone-nanospec-p2048", "standalone-nanospec-p2048-adaptive",
    ]  # fmt: skip
    by_name = {c.name: c for c in configs}
    twin = by_name["standalone-nanospec-p2048-adaptive"]
    assert twin.adaptive and "--nanospec-adaptive" in twin.flags
    assert flag(twin, "--nanospec-prior-k") == "2048"
    assert "--nanospec-adaptive" not in by_name["standalone-nanospec"].flags
    assert full_vocab_reference(configs, twin) == "standalone-full"
    preset = parse("--analysis", "adaptive")
    assert preset.adaptive and preset.modes == ["nanospec"] and preset.concurrency == [1, 4, 8, 16]
    assert parse("--adaptive").adaptive and not parse().adaptive
    # runs from before the field keep their directory; an adaptive run gets its own
    assert parse().digest() != preset.digest()


def test_cli_adaptive_needs_the_nanospec_mode(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        parse("--adaptive", "--modes", "full")
    assert "--adaptive" in capsys.readouterr().err


def test_eagle3_heads_get_every_mode_and_static_over_their_own_d2t() -> None:
    """An EAGLE-3 head's static configuration is its d2t vocabulary (no token map, named by
    |D|); a full-vocabulary EAGLE-3 head gets none (the server refuses static for it)."""
    from nanospec_server.models.tiny import tiny_model_path
    from nanospec_server.models.tiny.spec import PRUNED_DRAFT_VOCAB

    eagle2 = drafts_for("EAGLE", [tiny_model_path("tiny-eagle")], [(4, 4, 8)])
    pruned = drafts_for("EAGLE3", [tiny_model_path("tiny-eagle3")], [(4, 4, 8)])
    full = drafts_for("EAGLE3", [tiny_model_path("tiny-eagle3-full")], [(4, 4, 8)])
    maps = {2048: Path("map.pt")}
    configs = build_configs(eagle2 + pruned, ["full", "static", "nanospec"], [2048], [3072],
                            maps, [0, 2048])  # fmt: skip
    by_name = {c.name: c for c in configs}
    static = f"eagle3-static-{PRUNED_DRAFT_VOCAB}"
    assert list(by_name) == [
        "ar", "eagle-full", "eagle-static-2k", "eagle-nanospec", "eagle-nanospec-p2048",
        "eagle3-full", static, "eagle3-nanospec", "eagle3-nanospec-p2048",
    ]  # fmt: skip
    for name in ("eagle3-full", static, "eagle3-nanospec-p2048"):
        assert flag(by_name[name], "--speculative-algorithm") == "EAGLE3"
    assert flag(by_name[static], "--nanospec-mode") == "static"
    assert flag(by_name[static], "--speculative-token-map") is None
    assert flag(by_name["eagle-static-2k"], "--speculative-token-map") == "map.pt"
    assert full_vocab_reference(configs, by_name[static]) == "eagle3-full"
    only_full = build_configs(full, ["full", "static", "nanospec"], [2048], [3072], maps)
    assert [c.name for c in only_full] == ["ar", "eagle3-full", "eagle3-nanospec"]
    assert parse("--eagle3", "h").eagle3 == ["h"]
    assert parse("--eagle3", "h").digest() != parse().digest()
