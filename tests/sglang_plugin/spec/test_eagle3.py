"""EAGLE-3 inside a real server: top-K_pre from the target's prefill pass, rows only in D,
and ctx-only mode lossless.

Under EAGLE-3 the hidden states SGLang hands the draft are the target's auxiliary ones, so
``sglang_plugin/spec/draft_kinds/eagle3.py`` takes top-K_pre inside the target's logits processor. The
server records every request's candidate stream (``NANOSPEC_RECORD_STREAMS``); its
prefill candidates must be the top-K of a plain Hugging Face forward pass over the prompt
(final normed hidden states times the LM head) at every prompt position, with prefill
cut into chunks. In ctx-only mode the window then stays the prompt and those candidates,
so each request's active rows must be exactly (I ∩ D) ∪ {EOS}: a row for a token outside
D would show.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from nanospec_server.env import RECORD_STREAMS
from nanospec_server.launch.server import generate, running_server, speculative_flags
from nanospec_server.models.tiny import tiny_model_path
from nanospec_server.models.tiny.tokenizer import BOS_ID, EOS_ID, VOCAB_SIZE
from tests.serving.conftest import BASE_FLAGS

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

K_PRE, CHUNK, WINDOW = 3, 32, 4096
RNG = random.Random(23)
# Distinct first tokens: no prompt shares a cached prefix with another (a cached prefix
# is not run through the target again, so it has no candidates).
PROMPTS = [[BOS_ID, 3 + i] + [RNG.randrange(3, VOCAB_SIZE) for _ in range(n)]
           for i, n in enumerate([150, 70, 40, 3])]  # fmt: skip
# Logits closer than this may swap ranks between SGLang's fp32 kernels and torch's.
TIE = 1e-3


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> tuple[list[dict], dict[str, list[list[int]]]]:
    """Responses to PROMPTS (one at a time) and each request's recorded prefill appends."""
    folder = tmp_path_factory.mktemp("eagle3")
    streams = folder / "streams.jsonl"
    flags = speculative_flags("EAGLE3", "tiny-eagle3", 3, 1, 4)
    flags += ["--nanospec-mode", "ctx-only", "--nanospec-k-pre", str(K_PRE)]
    flags += ["--nanospec-w-max", str(WINDOW), "--nanospec-w-cap", str(WINDOW)]
    flags += ["--chunked-prefill-size", str(CHUNK)]
    model = ["--model-path", str(tiny_model_path("tiny-target"))]
    with pytest.MonkeyPatch.context() as env:
        env.setenv(RECORD_STREAMS, str(streams))  # the server inherits it
        with running_server(model + BASE_FLAGS + flags, folder / "server.log") as url:
            results = [generate(url, prompt, 8) for prompt in PROMPTS]
    appends: dict[str, list[list[int]]] = {}
    for line in streams.read_text().splitlines():
        record = json.loads(line)
        assert record["kind"] == "prefill"  # ctx-only: nothing enters while decoding
        appends.setdefault(record["rid"], []).append(record["tokens"])
    return results, appends


def split_prefill(appends: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """Each prefill chunk appends its prompt tokens, then K_pre candidates per position."""
    assert len(appends) % 2 == 0
    prompt = [t for chunk in appends[0::2] for t in chunk]
    top = [t for chunk in appends[1::2] for t in chunk]
    assert len(top) == K_PRE * len(prompt)
    return prompt, [top[i : i + K_PRE] for i in range(0, len(top), K_PRE)]


def reference_logits(prompt: list[int]) -> torch.Tensor:
    """Target logits at every prompt position, from its final normed hidden states."""
    path = str(tiny_model_path("tiny-target"))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        hidden = model(torch.tensor([prompt]), output_hidden_states=True).hidden_states[-1][0]
        return hidden @ model.lm_head.weight.T


def test_prefill_candidates_are_the_targets_top_k_at_every_position(served) -> None:
    results, appends = served
    assert any(len(p) > 2 * CHUNK for p in PROMPTS)  # some prefills take several chunks
    for prompt, result in zip(PROMPTS, results, strict=True):
        chunks = appends[result["meta_info"]["id"]]
        recorded_prompt, recorded_top = split_prefill(chunks)
        assert recorded_prompt == prompt
        assert len(chunks) >= 2 * (len(prompt) // CHUNK)  # one pair per prefill chunk
        logits = reference_logits(prompt)
        values, expected = logits.topk(K_PRE + 1, dim=-1)
        for position, got in enumerate(recorded_top):
            kth = values[position, K_PRE - 1]
            # every candidate is among the top K_pre (up to a near-tie at the boundary) ...
            assert (logits[position, got] >= kth - TIE).all(), position
            # ... and in rank order, exactly the reference's wherever no near-tie blurs it
            gaps = values[position].diff().abs()
            if (gaps > TIE).all():
                assert got == expected[position, :K_PRE].tolist(), position


def test_active_rows_are_the_window_within_d(served) -> None:
    results, appends = served
    tensors = load_file(str(tiny_model_path("tiny-eagle3") / "model.safetensors"))
    in_d = set((tensors["d2t"] + torch.arange(len(tensors["d2t"]))).tolist())
    union = {EOS_ID}
    for index, result in enumerate(results):
        window = {t for chunk in appends[result["meta_info"]["id"]] for t in chunk}
        assert window - in_d  # the window holds tokens outside D ...
        active = (window & in_d) | {EOS_ID}  # ... which get no row
        union |= active
        stats = result["meta_info"]["nanospec"][-1]
        assert stats["active_vocab_size"] == len(active)
        # Rows per head call: the window grows chunk by chunk, then stays (ctx-only). The
        # packed head also keeps earlier requests' rows until their slots are reused.
        assert stats["lm_head_rows_mean"] <= len(active if index == 0 else union)


def test_ctx_only_output_is_the_targets_greedy_continuation(served) -> None:
    """Lossless in ctx-only mode: each emitted token is the target's argmax given the prompt
    and the tokens before it (up to a near-tie), by one plain forward pass per request."""
    results, _ = served
    for prompt, result in zip(PROMPTS, results, strict=True):
        output = result["output_ids"]
        logits = reference_logits(prompt + output)[len(prompt) - 1 : -1]
        chosen = logits.gather(1, torch.tensor(output)[:, None]).squeeze(1)
        assert (chosen >= logits.max(dim=1).values - TIE).all()
