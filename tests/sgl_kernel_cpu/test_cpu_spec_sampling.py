"""Sampling tree verify on CPU: the stand-in op against a plain-Python reference, its output
distribution against the target's, the renorm ops, and the hook that lets EAGLE use them."""

from __future__ import annotations

import random
import struct

import pytest
import torch

from nanospec_server.sgl_kernel_cpu import shim as cpu_shim
from nanospec_server.sgl_kernel_cpu.ops import register_ops
from nanospec_server.sgl_kernel_cpu.ops.renorm import top_k_renorm_prob, top_p_renorm_prob
from nanospec_server.sgl_kernel_cpu.ops.spec_sampling import (
    tree_speculative_sampling_target_only,
)


def _may_register() -> bool:
    """Defining sgl_kernel ops here would clash with a later real sgl_kernel import."""
    return not torch.cuda.is_available() and not cpu_shim.real_sgl_kernel_loads()


def _op():
    if _may_register():
        register_ops()
        return torch.ops.sgl_kernel.tree_speculative_sampling_target_only
    return tree_speculative_sampling_target_only


# ----------------------------------------------------------------------------- trees


def _tree(rng: random.Random, n: int, topk: int) -> list[int]:
    """Parent of every node (root: -1); topk 1 gives a chain, else up to topk children."""
    if topk == 1:
        return [-1] + list(range(n - 1))
    parents = [-1]
    for node in range(1, n):
        open_nodes = [p for p in range(node) if parents.count(p) < topk]
        parents.append(rng.choice(open_nodes))
    return parents


def _depth(parents: list[int], node: int) -> int:
    steps = 0
    while parents[node] != -1:
        node, steps = parents[node], steps + 1
    return steps


def _links(parents: list[int]) -> tuple[list[int], list[int]]:
    """First child / next sibling lists, children in ascending node order (as SGLang)."""
    n = len(parents)
    first, sibling = [-1] * n, [-1] * n
    for node in range(n - 1, 0, -1):
        sibling[node] = first[parents[node]]
        first[parents[node]] = node
    return first, sibling


def _random_case(rng: random.Random, bs: int, n: int, topk: int, vocab: int):
    """Inputs for one op call: sibling tokens distinct, drawn from the parent's target
    distribution so that acceptance is common; some target rows have zeroed tokens."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
    logits = torch.randn(bs, n, vocab, generator=gen) * 2.5
    logits[torch.rand(bs, n, vocab, generator=gen) < 0.2] = float("-inf")
    logits[..., 0] = logits[..., 0].clamp_min(-1.0)  # every row keeps some mass
    probs = torch.softmax(logits, dim=-1)
    cands, nexts, sibs, depths = [], [], [], []
    for b in range(bs):
        parents = _tree(rng, n, topk)
        tokens = [rng.randrange(vocab)] + [0] * (n - 1)
        for p in range(n):
            kids = [c for c in range(1, n) if parents[c] == p]
            if kids:
                picks = torch.multinomial(probs[b, p] + 1e-3, len(kids), generator=gen)
                for kid, tok in zip(kids, picks.tolist(), strict=True):
                    tokens[kid] = tok
        first, sibling = _links(parents)
        cands.append(tokens)
        nexts.append(first)
        sibs.append(sibling)
        depths.append(max(_depth(parents, c) for c in range(n)))
    return {
        "candidates": torch.tensor(cands, dtype=torch.int64),
        "retrive_index": torch.arange(bs * n, dtype=torch.int64).view(bs, n),
        "retrive_next_token": torch.tensor(nexts, dtype=torch.int64),
        "retrive_next_sibling": torch.tensor(sibs, dtype=torch.int64),
        "uniform_samples": torch.rand(bs, n, generator=gen),
        "uniform_samples_for_final_sampling": torch.rand(bs, generator=gen),
        "target_probs": probs,
    }, max(depths)


def _outputs(bs: int, n: int, vocab: int, max_accept: int) -> dict[str, torch.Tensor]:
    return {
        "predicts": torch.full((bs * n,), -7, dtype=torch.int32),
        "accept_index": torch.full((bs, max_accept), -1, dtype=torch.int32),
        "accept_token_num": torch.full((bs,), -1, dtype=torch.int32),
        "draft_probs": torch.zeros(bs, n, vocab),
    }


# ----------------------------------------------------------------------------- reference


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _reference(case: dict, out: dict, threshold_single: float, threshold_acc: float) -> None:
    """The rule written out plainly on lists: one coin per level against the running sum
    of the children's target probabilities (float32 like the kernel), bonus by inverse CDF
    over the target minus the rejected children's mass."""
    cand = case["candidates"].tolist()
    rindex = case["retrive_index"].tolist()
    first = case["retrive_next_token"].tolist()
    sibling = case["retrive_next_sibling"].tolist()
    coins = case["uniform_samples"].tolist()
    final_coins = case["uniform_samples_for_final_sampling"].tolist()
    probs = case["target_probs"].tolist()
    predicts = out["predicts"]
    max_accept = out["accept_index"].shape[1]
    acc_div = _f32(max(threshold_acc, 1e-9))
    for b in range(len(cand)):
        node, accepted = 0, 0
        out["accept_index"][b, 0] = rindex[b][0]
        removed: set[int] = set()
        while accepted < max_accept - 1:
            removed = set()
            coin, running = coins[b][node], 0.0
            chosen = -1
            child = first[b][node]
            while child != -1:
                p = probs[b][node][cand[b][child]]
                running = _f32(running + p)
                if p > 0 and (coin < _f32(running / acc_div) or p >= _f32(threshold_single)):
                    chosen = child
                    break
                removed.add(cand[b][child])
                out["draft_probs"][b, node, cand[b][child]] = p
                child = sibling[b][child]
            if chosen == -1:
                break
            predicts[rindex[b][node]] = cand[b][chosen]
            accepted += 1
            out["accept_index"][b, accepted] = rindex[b][chosen]
            node = chosen
        if accepted == max_accept - 1:
            removed = set()  # the last node's children were never tried
        out["accept_token_num"][b] = accepted
        residual = [0.0 if t in removed else p for t, p in enumerate(probs[b][node])]
        target = final_coins[b] * sum(residual)
        running, pick = 0.0, -1
        for token, mass in enumerate(residual):
            running += mass
            if mass > 0 and running > target:
                pick = token
                break
        if pick == -1:
            positive = [t for t, mass in enumerate(residual) if mass > 0]
            pick = positive[-1] if positive else len(residual) - 1
        predicts[rindex[b][node]] = pick


TREE_SHAPES = {"chain": (1, 5), "topk2": (2, 8), "topk4": (4, 10)}


@pytest.mark.parametrize("thresholds", [(1.0, 1.0), (0.6, 0.8)])
@pytest.mark.parametrize("shape", TREE_SHAPES)
@pytest.mark.parametrize("seed", range(3))
def test_op_matches_reference(shape: str, seed: int, thresholds: tuple[float, float]) -> None:
    topk, n = TREE_SHAPES[shape]
    bs, vocab = 64, 11
    rng = random.Random(1000 * seed + n)
    case, depth = _random_case(rng, bs, n, topk, vocab)
    # seed 2 cuts accept_index below the tree depth, so the accept budget runs out
    max_accept = depth + 1 if seed < 2 else max(2, depth)
    got, want = _outputs(bs, n, vocab, max_accept), _outputs(bs, n, vocab, max_accept)
    single, acc = thresholds
    _op()(**case, **got, threshold_single=single, threshold_acc=acc, deterministic=True)
    _reference(case, want, single, acc)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert 0 < int(got["accept_token_num"].sum()) < bs * (max_accept - 1)  # both arms ran


def test_empty_batch_is_a_no_op() -> None:
    case, _ = _random_case(random.Random(0), 1, 4, 2, 5)
    case = {k: v[:0] for k, v in case.items()}
    out = _outputs(0, 4, 5, 3)
    _op()(**case, **out)


def test_thresholds_out_of_range_are_refused() -> None:
    case, _ = _random_case(random.Random(0), 2, 4, 2, 5)
    with pytest.raises((ValueError, RuntimeError), match="thresholds"):
        _op()(**case, **_outputs(2, 4, 5, 3), threshold_single=1.5, threshold_acc=1.0)


# ----------------------------------------------------------------------------- distribution

VOCAB = 6
# Root with children tokens 2, 0, 5 (sibling order); node 1 (token 2) has children 1, 3.
PARENTS = [-1, 0, 0, 0, 1, 1]
TOKENS = [4, 2, 0, 5, 1, 3]
ROOT_P = [0.05, 0.10, 0.30, 0.15, 0.25, 0.15]
NODE1_P = [0.40, 0.05, 0.05, 0.20, 0.10, 0.20]
CHI2_LIMIT = 25.0  # df 5: P(chi2 > 25) ~ 1e-4; the seed is fixed, so the test is stable


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_emitted_tokens_follow_the_target() -> None:
    bs, n = 30_000, len(PARENTS)
    gen = torch.Generator().manual_seed(1234)
    first, sibling = _links(PARENTS)
    probs = torch.full((n, VOCAB), 1.0 / VOCAB)
    probs[0], probs[1] = torch.tensor(ROOT_P), torch.tensor(NODE1_P)
    case = {
        "candidates": torch.tensor(TOKENS).repeat(bs, 1),
        "retrive_index": torch.arange(bs * n).view(bs, n),
        "retrive_next_token": torch.tensor(first).repeat(bs, 1),
        "retrive_next_sibling": torch.tensor(sibling).repeat(bs, 1),
        "uniform_samples": torch.rand(bs, n, generator=gen),
        "uniform_samples_for_final_sampling": torch.rand(bs, generator=gen),
        "target_probs": probs.expand(bs, n, VOCAB).contiguous(),
    }
    out = _outputs(bs, n, VOCAB, max_accept=3)
    _op()(**case, **out)

    predicts = out["predicts"].view(bs, n).to(torch.int64)
    first_tokens = predicts[:, 0]
    counts = torch.bincount(first_tokens, minlength=VOCAB).double()
    assert _chi2(counts, torch.tensor(ROOT_P, dtype=torch.float64)) < CHI2_LIMIT
    # Power check: a verify that draws the bonus from the full target (forgetting to remove
    # rejected children) over-weights the root's children, and this sample size sees it.
    children = torch.tensor([TOKENS[c] for c in (1, 2, 3)])
    p = torch.tensor(ROOT_P, dtype=torch.float64)
    miss = 1.0 - p[children].sum()
    wrong = p * miss
    wrong[children] += p[children]
    assert _chi2(counts, wrong) > 10 * CHI2_LIMIT

    # After token 2 (node 1 accepted) the next token must follow node 1's distribution.
    via_node1 = out["accept_index"][:, 1] == case["retrive_index"][:, 1].to(torch.int32)
    assert torch.equal(via_node1, first_tokens == TOKENS[1])
    second = predicts[via_node1, 1]
    counts = torch.bincount(second, minlength=VOCAB).double()
    assert _chi2(counts, torch.tensor(NODE1_P, dtype=torch.float64)) < CHI2_LIMIT


# ----------------------------------------------------------------------------- renorm


def test_top_k_renorm_keeps_the_k_largest() -> None:
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]])
    out = top_k_renorm_prob(probs, torch.tensor([2, 1, 1 << 30], dtype=torch.int32))
    expected = torch.tensor([[0, 4 / 7, 0, 3 / 7], [1.0, 0, 0, 0], [0.7, 0.1, 0.1, 0.1]])
    torch.testing.assert_close(out, expected)


def test_top_p_renorm_keeps_the_nucleus() -> None:
    probs = torch.tensor([[0.1, 0.4, 0.2, 0.3], [0.1, 0.4, 0.2, 0.3]])
    out = top_p_renorm_prob(probs, torch.tensor([0.5, 1.0]))
    # mass before 0.4 is 0 and before 0.3 is 0.4 (<= 0.5, kept); before 0.2 is 0.7 > 0.5
    torch.testing.assert_close(out[0], torch.tensor([0, 4 / 7, 0, 3 / 7]))
    torch.testing.assert_close(out[1], probs[1])


# ----------------------------------------------------------------------------- hook


def test_hook_lifts_cpu_greedy_only_for_the_stand_in() -> None:
    from nanospec_server.sglang_plugin.cpu import sampling as cpu_sampling

    if not _may_register():
        pytest.skip("a real sgl_kernel or CUDA is present: the hook must stay off")
    register_ops()
    assert cpu_sampling.stand_in_active()
    greedy = cpu_sampling._verify_uses_greedy_hook
    base = {"is_all_greedy": False, "is_hip": False, "is_xpu": False}

    def original(**kwargs: bool) -> bool:
        return kwargs["is_all_greedy"] or kwargs["is_cpu"] or kwargs["is_xpu"]

    assert not greedy(original, **base, is_cpu=True, use_rejection_sampling=False)
    assert greedy(original, **base, is_cpu=True, use_rejection_sampling=True)
    assert greedy(original, **{**base, "is_all_greedy": True}, is_cpu=True,
                  use_rejection_sampling=False)  # fmt: skip


# ----------------------------------------------------------------------------- engine

PROMPT = [0, 50, 60, 70, 80]  # BOS, then arbitrary tokens
SAMPLED_REQUESTS, GREEDY_REQUESTS, NEW_TOKENS, TOP_K = 40, 4, 8, 2


def _target_top_k(model, prompt: list[int], outputs: list[list[int]]) -> list[list[set[int]]]:
    """For each output, the target's TOP_K most likely tokens at every emitted position."""
    sets = []
    with torch.no_grad():
        for output in outputs:
            ids = torch.tensor([prompt + output[:-1]])
            logits = model(ids).logits[0, len(prompt) - 1 :]
            sets.append([set(row.topk(TOP_K).indices.tolist()) for row in logits])
    return sets


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_eagle_samples_on_cpu(tmp_path) -> None:
    """One EAGLE + nanospec server, one wave of concurrent requests on one prompt:
    top-k 2 sampling requests (each emitted token must be one of the target's top 2, and
    equal first tokens must not force equal continuations, as greedy verify would) mixed
    with temperature-0 requests (still exactly the target's greedy continuation)."""
    from concurrent.futures import ThreadPoolExecutor

    import transformers

    from nanospec_server.launch.server import generate, running_server, speculative_flags
    from nanospec_server.models.tiny import tiny_model_path
    from tests.serving.conftest import BASE_FLAGS

    target = tiny_model_path("tiny-target")
    flags = ["--model-path", str(target), *BASE_FLAGS]
    flags += speculative_flags("EAGLE", "tiny-eagle", 3, 2, 6) + ["--nanospec-mode", "nanospec"]
    sampled = {"temperature": 1.0, "top_k": TOP_K}
    greedy = {"temperature": 0.0}
    params = [sampled] * SAMPLED_REQUESTS + [greedy] * GREEDY_REQUESTS
    log = tmp_path / "server.log"
    with running_server(flags, log) as url, ThreadPoolExecutor(len(params)) as pool:
        results = list(pool.map(lambda p: generate(url, PROMPT, NEW_TOKENS, **p), params))
    assert "EAGLE verify samples on CPU" in log.read_text(errors="replace")
    assert all(r["meta_info"]["spec_verify_ct"] > 0 for r in results), "speculation did not run"
    outputs = [r["output_ids"] for r in results]
    sampled_out, greedy_out = outputs[:SAMPLED_REQUESTS], outputs[SAMPLED_REQUESTS:]

    model = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    plain = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False)
    assert all(out == plain[0, len(PROMPT) :].tolist() for out in greedy_out)

    for output, allowed in zip(sampled_out, _target_top_k(model, PROMPT, sampled_out), strict=True):
        assert all(token in ok for token, ok in zip(output, allowed, strict=True)), output
    # The first token comes from the ordinary sampler (two choices); with greedy verify
    # everything after it would be fixed, leaving at most TOP_K distinct outputs.
    assert len({tuple(out) for out in sampled_out}) > 4 * TOP_K
