"""Figures and the report from fixture records with known answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nanospec_server.bench.report import _load_table, write_report
from nanospec_server.bench.summary import OVERALL, lossless, summarize

REFS = {"ar": None, "eagle-full": None, "eagle-nanospec": "eagle-full",
        "eagle-static-32k": "eagle-full", "eagle-ctx-only": "eagle-full",
        "eagle-nanospec-p512": "eagle-full", "eagle-static-tpe": "eagle-full"}  # fmt: skip


def stats(coverage: float, active: float, rows: float) -> dict:
    return {"coverage": coverage, "draft_steps": 10, "active_vocab_mean": active,
            "lm_head_rows_mean": rows, "lm_head_calls": 40, "vocab_size": 1000}  # fmt: skip


def item(prompt: str, task: str, out: list[int], latency: float, accept=None, st=None) -> dict:
    return {"prompt_id": prompt, "task": task, "input_len": 10, "output_ids": out,
            "completion_tokens": len(out), "latency_s": latency,
            "verify_steps": 4 if accept else 0, "accept_length": accept, "nanospec": st}  # fmt: skip


def records() -> list[dict]:
    """Two prompts; each config's seconds per prompt are the AR seconds / speed-up."""
    speed = {"ar": 1.0, "eagle-full": 2.0, "eagle-nanospec": 3.0, "eagle-static-32k": 2.5, "eagle-ctx-only": 2.2,
             "eagle-nanospec-p512": 2.4, "eagle-static-tpe": 2.6}  # fmt: skip
    accept = {"ar": None, "eagle-full": 3.0, "eagle-nanospec": 2.9, "eagle-static-32k": 2.5, "eagle-ctx-only": 2.0,
              "eagle-nanospec-p512": 2.95, "eagle-static-tpe": 2.7}  # fmt: skip
    out = []
    for config, s in speed.items():
        for prompt, task in (("qa/1", "qa"), ("code/2", "code")):
            tokens = [1, 2, 3, 4, 5, 6, 7, 8]
            if config == "eagle-static-32k" and prompt == "code/2":
                tokens = [1, 2, 3, 9, 9, 9, 9, 9]  # a divergence at position 3
            st = None if config in ("ar", "eagle-full") else stats(0.9, 500, 600)
            out.append({"key": f"{config}|{prompt}", "group": 0, "config": config, "turn": 0,
                        "repeat": 0, "concurrency": 1, "wall_s": 4.0 / s,
                        "items": [item(prompt, task, tokens, 4.0 / s, accept[config], st)]})  # fmt: skip
    out.append({"key": "probe|g0", "group": 0, "divergences": [
        {"config": "eagle-static-32k", "turn": 0, "repeat": 0, "concurrency": 1, "prompt_id": "code/2",
         "position": 3, "ar_token": 4, "config_token": 9, "logprobs": {"4": -0.70, "9": -0.69},
         "text": {"4": "a", "9": "b"}}]})  # fmt: skip
    return out


def test_ratios_are_paired_and_figures_weighted() -> None:
    table = summarize(records(), REFS)[1]
    nano = table["eagle-nanospec"][OVERALL]
    assert nano["tokens_per_s"] == pytest.approx(16 / 8 * 3)
    assert nano["vs_ar"]["median"] == pytest.approx(3.0)
    assert nano["vs_full"]["median"] == pytest.approx(1.5)
    assert nano["vs_full"]["pairs"] == 2
    assert nano["accept_length"] == pytest.approx(2.9)
    assert nano["coverage"] == pytest.approx(0.9) and nano["lm_head_rows"] == pytest.approx(600)
    assert table["ar"][OVERALL]["vs_ar"] is None and table["eagle-full"][OVERALL]["vs_full"] is None
    assert set(table["eagle-full"]) == {"qa", "code", OVERALL}
    assert table["eagle-full"]["qa"]["vs_ar"]["median"] == pytest.approx(2.0)


def test_ratio_to_full_across_groups_goes_through_ar() -> None:
    # Servers in pairs: full beside ar in group 0, nanospec beside ar in group 1, where
    # the machine ran twice as slow (ar too): the ratio to full is taken through ar.
    def record(group: int, config: str, seconds: float) -> dict:
        return {"key": f"g{group}|{config}", "group": group, "config": config, "turn": 0,
                "repeat": 0, "concurrency": 1, "wall_s": seconds,
                "items": [item("qa/1", "qa", [1, 2, 3, 4], seconds, 3.0 if config != "ar" else None)]}  # fmt: skip

    runs = [record(0, "ar", 4.0), record(0, "eagle-full", 2.0),
            record(1, "ar", 8.0), record(1, "eagle-nanospec", 3.2)]  # fmt: skip
    table = summarize(runs, {"ar": None, "eagle-full": None, "eagle-nanospec": "eagle-full"})[1]
    nano = table["eagle-nanospec"][OVERALL]
    assert nano["vs_ar"]["median"] == pytest.approx(2.5)  # beside its own ar
    assert nano["vs_full"]["median"] == pytest.approx(2.5 / 2.0)  # not 2.0 / 3.2
    assert nano["vs_full"]["pairs"] == 1


def test_one_server_at_a_time_compares_across_groups_directly() -> None:
    # --max-servers 1: ar alone in group 0, each configuration alone after it.
    def record(group: int, config: str, seconds: float, out: list[int]) -> dict:
        return {"key": f"g{group}|{config}", "group": group, "config": config, "turn": 0,
                "repeat": 0, "concurrency": 1, "wall_s": seconds,
                "items": [item("qa/1", "qa", out, seconds, 3.0 if config != "ar" else None)]}  # fmt: skip

    runs = [record(0, "ar", 4.0, [1, 2, 3, 4]), record(1, "eagle-full", 2.0, [1, 2, 3, 4]),
            record(2, "eagle-nanospec", 1.6, [1, 2, 9, 9])]  # fmt: skip
    refs = {"ar": None, "eagle-full": None, "eagle-nanospec": "eagle-full"}
    nano = summarize(runs, refs, side_by_side=False)[1]["eagle-nanospec"][OVERALL]
    assert nano["vs_ar"]["median"] == pytest.approx(2.5)
    assert nano["vs_full"]["median"] == pytest.approx(1.25)
    # Side by side, a ratio needs a partner or an anchor beside it: none here.
    assert summarize(runs, refs)[1]["eagle-nanospec"][OVERALL]["vs_ar"]["median"] is None
    assert lossless(runs)["compared"]["eagle-nanospec"] == {"outputs": 1, "differing": 1}


def test_lossless_counts_differences_from_ar() -> None:
    checks = lossless(records())
    assert checks["compared"]["eagle-static-32k"] == {"outputs": 2, "differing": 1}
    assert checks["compared"]["eagle-nanospec"] == {"outputs": 2, "differing": 0}
    assert checks["divergences"][0]["position"] == 3
    # Near-ties may flip a token where numerics differ; where speculation is bit-identical
    # (fp32 on a CPU through our kernels) every differing output counts as a bug.
    assert checks["bugs"] == 0 and not checks["bitwise_expected"]
    assert lossless(records(), bitwise_expected=True)["bugs"] == 1


def test_report_writes_tables_and_figures(tmp_path: Path) -> None:
    info = {"command": "nanospec bench run --fixture", "versions": {"sglang": "0.5.23"},
            "hardware": {"cpu": "test"}, "references": REFS, "prompts": ["qa/1", "code/2"],
            "settings": {"target": "t", "dtype": "float32", "max_new_tokens": 8, "limit_per_task": 1,
                         "seed": 0, "repeats": 1, "concurrency": [1]}}  # fmt: skip
    (tmp_path / "run.json").write_text(json.dumps(info))
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records()))
    text = write_report(tmp_path).read_text()
    assert "nanospec bench run --fixture" in text and "max new tokens **8**" in text
    assert "| eagle-nanospec | 6.00 | 3.00x [3.00-3.00] | 1.50x [1.50-1.50] |" in text
    assert "Ablations (Table 5)" in text and "eagle-ctx-only" in text
    assert "| eagle-static-32k | 2 | 1 |" in text
    assert "| eagle-static-tpe | 5.20 | 2.60x" in text  # the trimmed map: a size of its own
    assert (tmp_path / "fig1a_eagle.png").stat().st_size > 1000
    # The hybrid vocabulary beside its k = 0 base: prior k, coverage, accept, rows, tok/s.
    assert "Hybrid vocabulary" in text
    assert "| eagle-nanospec | 0 | 0.900 | 2.90 | 600 | 6.00 | 3.00x" in text
    assert "| eagle-nanospec-p512 | 512 | 0.900 | 2.95 | 600 | 4.80 | 2.40x" in text
    assert "log-prob gap -0.0100" in text  # a near-tie, told apart from a bug
    for png in ("tokens_per_s_c1.png", "accept_length_c1.png", "coverage_c1.png"):
        assert (tmp_path / png).stat().st_size > 1000
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["results"]["1"]["eagle-nanospec"][OVERALL]["vs_ar"]["median"] == pytest.approx(
        3.0
    )


def test_draft_time_per_step_and_head_share_pool_the_requests() -> None:
    # Two requests: 1 s of draft over 10 steps (0.5 s in the head), 3 s over 30 (0.5 s).
    timed = [stats(0.9, 500, 600) | {"draft_seconds": d, "lm_head_seconds": h, "draft_steps": n}
             for d, h, n in ((1.0, 0.5, 10), (3.0, 0.5, 30))]  # fmt: skip
    runs = [{"key": f"{config}|{i}", "group": 0, "config": config, "turn": 0, "repeat": 0,
             "concurrency": 1, "wall_s": 1.0,
             "items": [item(f"qa/{i}", "qa", [1, 2], 1.0, 2.0 if st else None, st)]}
            for config, sts in (("ar", [None, None]), ("eagle-nanospec", timed))
            for i, st in enumerate(sts)]  # fmt: skip
    table = summarize(runs, {"ar": None, "eagle-nanospec": None})[1]
    nano = table["eagle-nanospec"][OVERALL]
    assert nano["draft_ms_per_step"] == pytest.approx(1000 * 4.0 / 40)
    assert nano["lm_head_share"] == pytest.approx(1.0 / 4.0)
    assert table["ar"][OVERALL]["draft_ms_per_step"] is None


def load_records() -> list[dict]:
    """ar, nanospec and nanospec-adaptive at concurrency 1 and 4 (one batch of four)."""
    seconds = {
        "ar": (2.0, 4.0),
        "eagle-nanospec": (1.0, 6.0),
        "eagle-nanospec-adaptive": (1.0, 4.0),
    }
    out = []
    for config, (alone, loaded) in seconds.items():
        tokens = [1, 2, 3, 4, 5, 6, 7, 8]
        out.append({"key": f"{config}|c1", "group": 0, "config": config, "turn": 0, "repeat": 0,
                    "concurrency": 1, "wall_s": alone,
                    "items": [item("qa/1", "qa", tokens, alone, 2.0 if config != "ar" else None)]})  # fmt: skip
        # four requests at once: latencies spread to the batch's wall time
        latencies = [loaded * f for f in (0.25, 0.5, 0.75, 1.0)]
        items = [item(f"p/{i}", "qa", tokens, lat) for i, lat in enumerate(latencies)]
        out.append({"key": f"{config}|c4", "group": 0, "config": config, "turn": 0, "repeat": 0,
                    "concurrency": 4, "wall_s": loaded, "items": items})  # fmt: skip
    return out


def test_load_table_reports_throughput_and_latency_by_concurrency(tmp_path: Path) -> None:
    refs = {"ar": None, "eagle-nanospec": None, "eagle-nanospec-adaptive": None}
    table = summarize(load_records(), refs)
    loaded = table[4]["eagle-nanospec-adaptive"][OVERALL]
    assert loaded["tokens_per_s"] == pytest.approx(32 / 4.0)  # all requests' tokens / wall
    assert loaded["latency_median_s"] == pytest.approx(2.5)
    assert loaded["latency_p90_s"] == pytest.approx(3.7)  # inclusive: 3 + 0.7 * (4 - 3)
    assert table[4]["eagle-nanospec"][OVERALL]["vs_ar"]["median"] == pytest.approx(4 / 6)
    info = {"command": "nanospec bench run --analysis adaptive", "versions": {}, "hardware": {},
            "references": refs, "prompts": ["qa/1"],
            "settings": {"target": "t", "dtype": "float32", "max_new_tokens": 8, "limit_per_task": 1,
                         "seed": 0, "repeats": 1, "concurrency": [1, 4]}}  # fmt: skip
    (tmp_path / "run.json").write_text(json.dumps(info))
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in load_records()))
    text = write_report(tmp_path).read_text()
    assert "Under load" in text
    assert "| eagle-nanospec-adaptive | 4 | 8.00 | 1.00x [1.00-1.00] | 2.50 | 3.70 |" in text
    assert "| eagle-nanospec | 4 | 5.33 | 0.67x [0.67-0.67] | 3.75 | 5.55 |" in text
    assert (tmp_path / "load.png").stat().st_size > 1000


def test_no_load_table_without_adaptive_runs(tmp_path: Path) -> None:
    assert _load_table(summarize(records(), REFS)) == []
