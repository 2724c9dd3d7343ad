"""Coverage-latency trimming: coverage and FLOPs against plain references, the TPE search
against known optima, and `nanospec vocab trim` end to end on the tiny tokenizer."""

from __future__ import annotations

import json
import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from nanospec_server.cli import main
from nanospec_server.models.tiny import tiny_model_path
from nanospec_server.models.tiny.tokenizer import CORPUS_PATH
from nanospec_server.vocab_tools.answers import assistant_texts
from nanospec_server.vocab_tools.trim import (
    DraftShape,
    LatencyModel,
    TreeShape,
    TrimProblem,
    backbone_flops,
    calibrate,
    count_tokens,
    coverage_curve,
    exhaustive_best,
    held_out_coverage,
    round_flops,
    tpe_maximise,
    trim,
)

ANSWERS = ["the cat sat on the mat.", "The dog, the cat and the bird.", "a b a b a c"]


def plain_coverage(tokens: list[int], kept: set[int]) -> float:
    return sum(t in kept for t in tokens) / len(tokens)


def test_coverage_of_a_hand_made_corpus() -> None:
    tokens = [5, 5, 5, 7, 7, 9, 1]  # 1 is EOS, always kept
    curve = coverage_curve(Counter(tokens), always=[1])
    assert curve.ranked == [1, 5, 7, 9]
    assert [curve.coverage(k) for k in range(6)] == [
        0, 1 / 7, 4 / 7, 6 / 7, 1.0, 1.0,
    ]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=200), st.lists(st.integers(0, 40), max_size=3)
)
def test_coverage_matches_counting_the_kept_tokens(tokens: list[int], always: list[int]) -> None:
    curve = coverage_curve(Counter(tokens), always)
    for k in range(len(curve.ranked) + 2):
        assert curve.coverage(k) == pytest.approx(plain_coverage(tokens, set(curve.ranked[:k])))
    # the ranking is by count (always-kept ids first): no prefix covers less than another
    # prefix of the same size could
    free = Counter(t for t in tokens if t not in set(always))
    ranked_free = [t for t in curve.ranked if t not in set(always)]
    assert [free[t] for t in ranked_free] == sorted((free[t] for t in ranked_free), reverse=True)


def test_held_out_coverage_ranks_on_other_folds_and_counts_on_its_own() -> None:
    answers = [[5, 5, 6], [7, 7, 7, 5], [6, 6, 8], [5, 9]]  # folds: answers 0, 2 | 1, 3
    held = held_out_coverage([Counter(a) for a in answers], 2, always=[1], vocab_size=100)
    assert held.ranked == [1, 5, 6, 7, 8, 9]  # all answers: 5 x4, 6 x3, 7 x3, 8, 9
    fold_a, fold_b = answers[0] + answers[2], answers[1] + answers[3]
    # fold a is counted on a ranking of fold b (EOS, 7, 5, 9) and the other way round
    rank_b, rank_a = [1, 7, 5, 9], [1, 6, 5, 8]
    for k in range(7):
        expected = (
            plain_coverage(fold_a, set(rank_b[:k])) + plain_coverage(fold_b, set(rank_a[:k]))
        ) / 2
        assert held.coverage(k) == pytest.approx(expected), k
    assert held.coverage(100) == 1.0  # the whole vocabulary holds every token
    with pytest.raises(ValueError):
        held_out_coverage([Counter([5])], 2, [], 100)


def test_tokens_are_counted_over_the_answers_only(tmp_path) -> None:
    tok = AutoTokenizer.from_pretrained(str(tiny_model_path("tiny-target")))
    path = tmp_path / "chats.jsonl"
    lines = [{"conversations": [{"role": "user", "content": "IGNORED PROMPT"},
                                {"role": "assistant", "content": ANSWERS[0]}]},
             {"messages": [{"role": "assistant", "content": ANSWERS[1]}]},
             {"answer": ANSWERS[2], "prompt": "IGNORED"}]  # fmt: skip
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert list(assistant_texts([path])) == ANSWERS
    expected = Counter(t for a in ANSWERS for t in tok.encode(a, add_special_tokens=False))
    assert count_tokens(tok, assistant_texts([path])) == expected


def llama_shape(layers: int, heads: int, kv_heads: int) -> tuple[DraftShape, LlamaForCausalLM]:
    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=300)  # fmt: skip
    model = LlamaForCausalLM(config)
    return DraftShape.from_config(config.to_dict()), model


@pytest.mark.parametrize(("layers", "heads", "kv_heads"), [(1, 4, 2), (3, 8, 8)])
def test_backbone_flops_are_twice_the_layer_weights_plus_attention(layers, heads, kv_heads) -> None:
    shape, model = llama_shape(layers, heads, kv_heads)
    weights = sum(
        m.weight.numel() for m in model.model.layers.modules() if isinstance(m, nn.Linear)
    )
    context = 100
    attention = layers * 2 * context * heads * shape.head_dim  # q.k and p.v per head dim
    assert backbone_flops(shape, context) == 2 * (weights + attention)
    eagle = DraftShape(**{**vars(shape), "eagle": True})
    fc = 2 * 64 * 64  # [embedding, hidden] -> hidden
    assert backbone_flops(eagle, context) == 2 * (weights + attention + fc)


def test_a_round_runs_every_tree_token_through_backbone_and_head() -> None:
    shape, model = llama_shape(1, 4, 2)
    tree = TreeShape(steps=3, topk=2)
    assert tree.draft_tokens == 1 + 2 * 2
    head = 2 * 64 * 50
    assert round_flops(shape, tree, 50, 10) == 5 * (backbone_flops(shape, 10) + head)


def test_calibration_recovers_a_linear_cost_and_scores_the_fit() -> None:
    points = [(f"p{g}", g, 0.3 + 2.0 * g) for g in (0.01, 0.1, 0.5, 1.0)]
    fit = calibrate(points)
    assert fit.model.ms_per_forward == pytest.approx(0.3)
    assert fit.model.ms_per_gflop == pytest.approx(2.0)
    assert fit.r2 == pytest.approx(1.0) and fit.max_relative_error < 1e-9
    noisy = calibrate(
        [(w, g, ms * (1.3 if i == 0 else 1.0)) for i, (w, g, ms) in enumerate(points)]
    )
    assert noisy.r2 < 1.0 and noisy.max_relative_error > 0.05


def test_tpe_finds_the_peak_of_a_synthetic_utility() -> None:
    peak = 1500
    search = tpe_maximise(lambda k: -((math.log(k) - math.log(peak)) ** 2), lambda k: True,
                          1, 100_000, trials=80, seed=0)  # fmt: skip
    assert abs(search.best_k / peak - 1) < 0.1, search.best_k


def test_tpe_respects_the_constraint() -> None:
    # smaller is better, but only sizes >= 700 are allowed: the optimum is the boundary
    search = tpe_maximise(lambda k: -k, lambda k: k >= 700, 1, 100_000, trials=80, seed=0)
    assert 700 <= search.best_k <= 770, search.best_k
    assert all(t["feasible"] == (t["k"] >= 700) for t in search.trials)
    none = tpe_maximise(lambda k: -k, lambda k: False, 1, 100, trials=5, seed=0)
    assert none.best_k is None


def problem(min_coverage: float) -> TrimProblem:
    # Zipf-like counts over 20k tokens; an EAGLE-like draft whose head dominates its FLOPs.
    counts = Counter({t: int(1e6 / (t + 1) ** 1.1) + 1 for t in range(20_000)})
    shape = DraftShape(hidden=896, intermediate=4864, layers=1, heads=14, kv_heads=2,
                       head_dim=64, vocab_size=151_936, eagle=True)  # fmt: skip
    return TrimProblem(coverage_curve(counts), shape, min_coverage=min_coverage)


def test_trim_agrees_with_brute_force_on_the_utility() -> None:
    p = problem(min_coverage=0.0)
    search = trim(p, trials=60, seed=0)
    best = exhaustive_best(p)
    assert p.utility(search.best_k) == pytest.approx(p.utility(best), abs=2e-3)
    assert p.utility(search.best_k) > p.utility(p.shape.vocab_size)  # trimming pays


def test_trim_meets_the_minimum_coverage() -> None:
    p = problem(min_coverage=0.99)
    search = trim(p, trials=60, seed=0)
    assert p.curve.coverage(search.best_k) >= 0.99
    # without the constraint the optimum lies below it: the constraint is what binds
    assert p.curve.coverage(exhaustive_best(problem(0.0))) < 0.99
    assert p.utility(search.best_k) == pytest.approx(p.utility(exhaustive_best(p)), abs=2e-3)


def test_latency_saved_uses_the_latency_model() -> None:
    p = problem(0.0)
    flops_only = p.latency_saved(1000)
    with_overhead = TrimProblem(p.curve, p.shape, latency=LatencyModel(1.0, 5.0)).latency_saved(
        1000
    )
    assert 0 < with_overhead < flops_only < 1  # a fixed cost per call shrinks what trimming saves
    assert p.latency_saved(p.shape.vocab_size) == 0.0


def test_vocab_trim_writes_a_token_map(tmp_path, capsys) -> None:
    out = tmp_path / "map.pt"
    argv = ["vocab", "trim", "--tokenizer", str(tiny_model_path("agree-target")),
            "--draft-config", str(tiny_model_path("agree-eagle")), "--answers", str(CORPUS_PATH),
            "--min-coverage", "0.9", "--trials", "30", "--output", str(out)]  # fmt: skip
    assert main(argv) == 0
    ids = torch.load(out)
    summary = json.loads(out.with_suffix(".json").read_text())
    assert len(ids) == summary["best"]["k"] and len(set(ids)) == len(ids)
    assert ids[0] == 1  # EOS first, always kept
    assert summary["best"]["coverage"] >= 0.9
    tok = AutoTokenizer.from_pretrained(str(tiny_model_path("agree-target")))
    tokens = tok.encode(CORPUS_PATH.read_text(), add_special_tokens=False)
    assert summary["best"]["coverage"] == pytest.approx(plain_coverage(tokens, set(ids)))
    assert "k = " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("change", "flag"),
    [({"--min-coverage": "1.5"}, "--min-coverage"), ({"--answers": "/nonexistent.jsonl"}, "--answers"),
     ({"--draft-config": "/nonexistent"}, "--draft-config"), ({"--trials": "0"}, "--trials")],
)  # fmt: skip
def test_vocab_trim_names_a_bad_flag(tmp_path, capsys, change: dict, flag: str) -> None:
    values = {"--tokenizer": str(tiny_model_path("agree-target")),
              "--draft-config": str(tiny_model_path("agree-eagle")), "--answers": str(CORPUS_PATH),
              "--min-coverage": "0.9", "--trials": "5", "--output": str(tmp_path / "m.pt")} | change  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main(["vocab", "trim", *[x for kv in values.items() for x in kv]])
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err


def test_full_coverage_is_reachable_and_bad_json_is_a_flag_error(tmp_path, capsys) -> None:
    answers = tmp_path / "a.jsonl"
    answers.write_text(json.dumps({"answer": "aaaa"}) + "\n")
    argv = ["vocab", "trim", "--tokenizer", str(tiny_model_path("agree-target")),
            "--draft-config", str(tiny_model_path("agree-eagle")), "--answers", str(answers),
            "--min-coverage", "1.0", "--trials", "5", "--output", str(tmp_path / "m.pt")]  # fmt: skip
    assert main(argv) == 0  # 1.0 is reachable: every answer token is in the ranking
    answers.write_text("not json\n")
    with pytest.raises(SystemExit):
        main(argv[:-2] + ["--output", str(tmp_path / "n.pt")])
    assert "--answers" in capsys.readouterr().err
