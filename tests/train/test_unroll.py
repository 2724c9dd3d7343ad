"""The training-time test (`EagleHead.unroll`, `loop.unrolled_loss`) against drafting step
by step the way SGLang drafts: a KV cache of the target-feature prefix, then one token
at a time fed the head's own predicted feature."""

from __future__ import annotations

import copy

import torch
from safetensors.torch import load_file

from nanospec_server.models.tiny import tiny_model_path
from nanospec_server.train.head import EagleHead, HeadConfig, rope_cos_sin
from nanospec_server.train.loop import LoopConfig, chain_acceptance, unrolled_loss
from nanospec_server.train.loss import LossWeights, eagle_loss
from nanospec_server.train.target import SharedWeights, read_config

STEPS, BATCH, LENGTH = 3, 2, 12


def tiny_setup(seed: int = 0):
    target_dir = tiny_model_path("tiny-target")
    weights = load_file(str(target_dir / "model.safetensors"))
    # float64: the parallel and the step-by-step sums then agree to many digits
    shared = SharedWeights(weights["model.embed_tokens.weight"].double(), weights["lm_head.weight"].double())  # fmt: skip
    head = EagleHead(HeadConfig.from_target(read_config(target_dir)))
    generator = torch.Generator().manual_seed(seed)
    head.reset_parameters(generator, std=0.2)  # large enough that steps differ visibly
    head.double()
    tokens = torch.randint(3, shared.embed.shape[0], (BATCH, LENGTH + 1), generator=generator)
    features = torch.randn(BATCH, LENGTH + 1, head.cfg.hidden_size, generator=generator).double()
    embeds = shared.embed[tokens[:, 1:]]
    positions = torch.arange(LENGTH)
    mask = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    mask[0, :2] = False  # a prompt
    mask[1, -3:] = False  # a short row
    inputs = (embeds, features[:, :-1], features[:, 1:], positions, mask)
    return head, shared, inputs


def draft_step_by_step(head: EagleHead, embeds, features, positions, start: int, steps: int):
    """SGLang's draft from ``start``: prefix keys from the target's features, then the
    head's own guesses, one position at a time."""
    layer, attn = head.layers[0], head.layers[0].self_attn
    cos, sin = rope_cos_sin(positions, head.cfg.head_dim, head.cfg.rope_theta)
    prefix = head.fc(torch.cat([embeds[:, : start + 1], features[:, : start + 1]], dim=-1))
    q, k, v = attn.project(prefix, cos[: start + 1], sin[: start + 1])
    keys, values = [k], [v]
    every = torch.ones(1, start + 1, dtype=torch.bool)
    guess = layer.finish(prefix[:, -1:], attn.attend(q[:, :, -1:], k, v, every))
    guesses = [guess]
    for step in range(1, steps):
        i = start + step
        x = head.fc(torch.cat([embeds[:, i : i + 1], guess], dim=-1))
        q, k, v = attn.project(x, cos[i : i + 1], sin[i : i + 1])
        keys.append(k)
        values.append(v)
        keys_so_far = torch.cat(keys, 2)
        every = torch.ones(1, keys_so_far.shape[2], dtype=torch.bool)
        guess = layer.finish(x, attn.attend(q, keys_so_far, torch.cat(values, 2), every))
        guesses.append(guess)
    return guesses


def test_one_step_unroll_is_teacher_forcing() -> None:
    head, _, (embeds, features, _, positions, _) = tiny_setup()
    (unrolled,) = head.unroll(embeds, features, positions, 1)
    torch.testing.assert_close(unrolled, head(embeds, features, positions))


def test_unrolled_steps_equal_step_by_step_drafts() -> None:
    head, _, (embeds, features, _, positions, _) = tiny_setup()
    with torch.no_grad():
        unrolled = head.unroll(embeds, features, positions, STEPS)
        for start in range(LENGTH - STEPS + 1):
            chain = draft_step_by_step(head, embeds, features, positions, start, STEPS)
            for step, guess in enumerate(chain):
                torch.testing.assert_close(unrolled[step][:, start + step], guess[:, 0])
    # the steps really differ: guesses are not the target's features
    assert not torch.allclose(unrolled[1][:, 2:], unrolled[0][:, 2:], atol=1e-3)


def reference_loss(head, shared, inputs, cfg: LoopConfig):
    """The same objective, every prediction drafted step by step."""
    embeds, features, targets, positions, mask = inputs
    total = 0.0
    weights = [cfg.unroll_decay**step for step in range(cfg.unroll_steps)]
    for step, weight in enumerate(weights):
        predicted = torch.zeros_like(targets)
        valid = torch.zeros_like(mask)
        for i in range(step, LENGTH):
            start = i - step
            guess = draft_step_by_step(head, embeds, features, positions, start, step + 1)[-1]
            predicted[:, i] = guess[:, 0]
            valid[:, i] = mask[:, i] & mask[:, start]
        parts = eagle_loss(predicted, targets, valid, shared.lm_head, cfg.loss)
        total = total + weight * parts.total
    return total / sum(weights)


def test_unrolled_training_equals_step_by_step_training() -> None:
    head, shared, inputs = tiny_setup()
    cfg = LoopConfig(steps=3, batch_rows=BATCH, lr=1e-2, warmup_steps=0, unroll_steps=STEPS,
                     loss=LossWeights(cls_stride=1))  # fmt: skip
    reference = copy.deepcopy(head)
    fast_opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr)
    slow_opt = torch.optim.AdamW(reference.parameters(), lr=cfg.lr)
    for _ in range(cfg.steps):
        fast = unrolled_loss(head, inputs, shared, cfg, offset=0).total
        slow = reference_loss(reference, shared, inputs, cfg)
        torch.testing.assert_close(fast, slow, rtol=1e-4, atol=1e-5)
        for loss, opt in ((fast, fast_opt), (slow, slow_opt)):
            opt.zero_grad()
            loss.backward()
            opt.step()
    for (name, a), b in zip(head.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_chain_acceptance_counts_guesses_until_the_first_miss() -> None:
    """A head that returns its input feature unchanged guesses f_i for f_{i+1}: with
    targets built so that f_{i+1} == f_i at chosen positions, acceptance is countable."""
    head, shared, (embeds, features, targets, positions, mask) = tiny_setup()
    cfg = LoopConfig(steps=1, batch_rows=BATCH, lr=1e-3, warmup_steps=0, accept_steps=STEPS,
                     accept_stride=1)  # fmt: skip

    class Echo(EagleHead):
        def unroll(self, next_embeds, features, positions, steps):
            # step j at i drafts from start i - j: echo the start's feature
            return [torch.roll(features, step, dims=1) for step in range(steps)]

    echo = Echo(head.cfg)
    mask = torch.ones(1, LENGTH, dtype=torch.bool)
    base = features[:1].clone()
    # f_1 == f_0 == f_2: a start at 0 guesses f_0 for f_1 (hit) and f_0 for f_2 (hit),
    # then f_0 for f_3 (miss); every other start misses at once.
    base[:, 1] = base[:, 0]
    tgt = torch.cat([base[:, 1:], torch.randn(1, 1, base.shape[2]).double()], dim=1)
    tgt[:, 1] = base[:, 0]
    accept, count = chain_acceptance(echo, (embeds[:1], base, tgt, positions, mask), shared, cfg)
    assert count == LENGTH
    expected_hits = [0] * LENGTH
    for start in range(LENGTH):
        for step in range(STEPS):
            i = start + step
            if i >= LENGTH:
                break
            guess = (base[0, start] @ shared.lm_head.T).argmax()
            if guess != (tgt[0, i] @ shared.lm_head.T).argmax():
                break
            expected_hits[start] += 1
    assert accept == 1 + sum(expected_hits) / LENGTH
    assert max(expected_hits) >= 2
