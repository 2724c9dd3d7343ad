"""`train-eagle --arch eagle3` parts against plain references: the captured layers equal
SGLang's choice, the fused features equal transformers' ``output_hidden_states``, D and
d2t/t2d equal a set-based SpecForge reference, the unrolled head equals drafting step by
step as SGLang drafts, and a run killed between checkpoints resumes to the same weights."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanospec_server.train import eagle3_loop
from nanospec_server.train.attention import use_grouped_sdpa
from nanospec_server.train.distill import DistilledRows, generate_rows
from nanospec_server.train.eagle3_features import aux_layer_ids, capture_layers
from nanospec_server.train.eagle3_head import Eagle3Config, Eagle3Head
from nanospec_server.train.eagle3_loop import Eagle3LoopConfig, batch_inputs, train
from nanospec_server.train.eagle3_vocab import answer_token_counts, d2t_t2d, draft_vocabulary
from nanospec_server.train.head import HeadConfig, rope_cos_sin
from nanospec_server.vocab.draft_vocab import DraftIds

CPU = torch.device("cpu")


def _sglang_capture(num_layers: int, layer_ids: list[int] | None) -> list[int]:
    """What SGLang 0.5.23's own ``set_eagle3_layers_to_capture`` sets, on a stand-in model."""
    from sglang.srt.models.qwen2 import Qwen2ForCausalLM

    model = SimpleNamespace(
        pp_group=SimpleNamespace(is_last_rank=True),
        config=SimpleNamespace(num_hidden_layers=num_layers),
        model=SimpleNamespace(layers_to_capture=[]),
    )
    Qwen2ForCausalLM.set_eagle3_layers_to_capture(model, layer_ids)
    return model.model.layers_to_capture


@pytest.mark.parametrize("num_layers", [8, 24, 28, 36])
def test_default_layers_are_sglangs(num_layers: int) -> None:
    capture = capture_layers(num_layers)
    assert capture == _sglang_capture(num_layers, None)
    # the ids written into the head's config make SGLang capture the same layers
    assert _sglang_capture(num_layers, aux_layer_ids(capture)) == capture


def test_layers_that_do_not_fit_are_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="--aux-layers"):
        capture_layers(2)  # [2, 1, -1]: the tiny target
    with pytest.raises(ValueError, match="--aux-layers"):
        capture_layers(4, [0, 3])
    assert capture_layers(2, [0, -1]) == [0, 1]  # layer order, as SGLang concatenates


def _deep_target() -> torch.nn.Module:
    """A random 8-layer Qwen2 (q/k/v biases, grouped heads), fp32."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128, tie_word_embeddings=False)  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # larger logits: greedy answers that are not one repeated token
        model.lm_head.weight.mul_(20)
    return model


def test_fused_features_equal_output_hidden_states() -> None:
    """Answering with captured inputs (batched, left-padded, KV cache, grouped attention)
    keeps, at every position of every row, transformers' ``hidden_states[c]`` of a plain
    teacher-forced pass over the row, concatenated over SGLang's default layers."""
    model = _deep_target()
    answering = _deep_target()
    use_grouped_sdpa(answering)
    capture = capture_layers(8)  # [2, 4, 5]
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, 300, (n,), generator=generator).tolist() for n in (4, 9, 2, 13)]
    rows = generate_rows(answering, prompts, 30, eos_ids={0}, device=CPU, aux_layers=capture)
    assert rows.hidden.shape[-1] == 3 * 32
    for row in range(len(prompts)):
        length = int(rows.lengths[row])
        assert length > len(prompts[row]) + 3  # the answer is part of what is compared
        with torch.inference_mode():
            out = model.model(input_ids=rows.input_ids[row : row + 1, :length].long(),
                              output_hidden_states=True)  # fmt: skip
        want = torch.cat([out.hidden_states[c][0] for c in capture], dim=-1)
        torch.testing.assert_close(rows.hidden[row, :length].float(), want, rtol=0.02, atol=0.02)
        assert not rows.hidden[row, length:].any()


def _specforge_reference(counts: list[int], size: int) -> tuple[list[int], list[bool]]:
    """Plain lists and sets: the ``size`` most frequent tokens (ties: lower id), ascending."""
    ranked = sorted(range(len(counts)), key=lambda token: (-counts[token], token))
    used = sorted(ranked[:size])
    chosen = set(used)
    return [used[i] - i for i in range(size)], [t in chosen for t in range(len(counts))]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_d2t_t2d_round_trip_against_a_plain_reference(data) -> None:
    vocab_size = data.draw(st.integers(1, 80))
    counts = data.draw(st.lists(st.integers(0, 5), min_size=vocab_size, max_size=vocab_size))
    size = data.draw(st.integers(1, vocab_size))
    draft_ids = draft_vocabulary(torch.tensor(counts), size)
    d2t, t2d = d2t_t2d(draft_ids, vocab_size)
    want_d2t, want_t2d = _specforge_reference(counts, size)
    assert d2t.tolist() == want_d2t and d2t.dtype == torch.int64
    assert t2d.tolist() == want_t2d and t2d.dtype == torch.bool
    # what SGLang loads (d2t + arange) is D, and our inverse agrees with t2d
    hot = d2t + torch.arange(size)
    assert hot.tolist() == draft_ids.tolist() == t2d.nonzero().flatten().tolist()
    inverse = DraftIds.from_hot_token_ids(hot, vocab_size)
    assert ((inverse.draft_of >= 0) == t2d).all()


def test_answer_counts_are_the_answer_tokens() -> None:
    rows = DistilledRows(
        input_ids=torch.tensor([[5, 6, 7, 7, 0], [6, 8, 9, 0, 0]], dtype=torch.int32),
        hidden=torch.zeros(2, 5, 1, dtype=torch.bfloat16),
        lengths=torch.tensor([4, 3], dtype=torch.int32),
        prompt_lengths=torch.tensor([2, 1], dtype=torch.int32),
    )
    counts = answer_token_counts(rows, 10)
    assert {t: int(c) for t, c in enumerate(counts) if c} == {7: 2, 8: 1, 9: 1}


def _tiny_head(seed: int = 0, aux: int = 3, vocab: int = 50) -> Eagle3Head:
    layer = HeadConfig(hidden_size=16, intermediate_size=24, num_heads=4, num_kv_heads=2,
                       head_dim=4, rms_norm_eps=1e-6, rope_theta=10000.0, qkv_bias=False)  # fmt: skip
    head = Eagle3Head(Eagle3Config(layer, aux, vocab))
    head.reset_parameters(torch.Generator().manual_seed(seed), std=0.3)
    return head.double()


def _draft_step_by_step(head: Eagle3Head, embeds, aux, positions, start: int, steps: int):
    """SGLang's EAGLE-3 draft from ``start``: extend over fc(aux) of the prefix (KV cache),
    then one position at a time fed the previous step's pre-norm output, fc skipped."""
    layer, attn = head.midlayer, head.midlayer.self_attn
    cos, sin = rope_cos_sin(positions, head.cfg.layer.head_dim, head.cfg.layer.rope_theta)
    hidden = head.fc(aux[:, : start + 1])
    q, k, v = attn.project(layer.attention_input(embeds[:, : start + 1], hidden),
                           cos[: start + 1], sin[: start + 1])  # fmt: skip
    keys, values = [k], [v]
    every = torch.ones(1, start + 1, dtype=torch.bool)
    guess = layer.finish(hidden[:, -1:], attn.attend(q[:, :, -1:], k, v, every))
    guesses = [guess]
    for step in range(1, steps):
        i = start + step
        x = layer.attention_input(embeds[:, i : i + 1], guess)
        q, k, v = attn.project(x, cos[i : i + 1], sin[i : i + 1])
        keys.append(k)
        values.append(v)
        keys_so_far = torch.cat(keys, 2)
        every = torch.ones(1, keys_so_far.shape[2], dtype=torch.bool)
        guess = layer.finish(guess, attn.attend(q, keys_so_far, torch.cat(values, 2), every))
        guesses.append(guess)
    return guesses


def test_unrolled_steps_equal_step_by_step_drafts() -> None:
    head = _tiny_head()
    generator = torch.Generator().manual_seed(1)
    length, steps = 10, 4
    embeds = torch.randn(2, length, 16, generator=generator).double()
    aux = torch.randn(2, length, 48, generator=generator).double()
    positions = torch.arange(length)
    with torch.no_grad():
        unrolled = head.unroll(embeds, aux, positions, steps)
        for start in range(length - steps + 1):
            chain = _draft_step_by_step(head, embeds, aux, positions, start, steps)
            for step, guess in enumerate(chain):
                torch.testing.assert_close(unrolled[step][:, start + step], guess[:, 0])
    assert not torch.allclose(unrolled[1][:, 1:], unrolled[0][:, 1:], atol=1e-3)


def test_labels_are_the_next_answer_tokens_in_draft_ids() -> None:
    """Pair i learns t_{i+2} from the last prompt token to the third-last real token; a
    label outside D is -1 (left out of the loss)."""
    rows = DistilledRows(
        input_ids=torch.tensor([[1, 2, 3, 4, 5, 6, 0], [1, 2, 9, 4, 0, 0, 0]], dtype=torch.int32),
        hidden=torch.zeros(2, 7, 6, dtype=torch.bfloat16),
        lengths=torch.tensor([6, 4], dtype=torch.int32),
        prompt_lengths=torch.tensor([3, 1], dtype=torch.int32),
    )
    draft_of = torch.full((10,), -1)
    draft_of[torch.tensor([4, 5, 6])] = torch.tensor([0, 1, 2])  # D = {4, 5, 6}
    batch = batch_inputs(rows, torch.randn(10, 2), draft_of, CPU)
    assert batch.mask[0].nonzero().flatten().tolist() == [2, 3]
    assert batch.mask[1].nonzero().flatten().tolist() == [0, 1]
    assert batch.labels.tolist() == [[-1, -1, 1, 2, -1], [-1, 0, -1, -1, -1]]


def _resume_setup():
    generator = torch.Generator().manual_seed(5)
    rows = DistilledRows(
        input_ids=torch.randint(1, 50, (6, 12), generator=generator, dtype=torch.int32),
        hidden=torch.randn(6, 12, 48, generator=generator).to(torch.bfloat16),
        lengths=torch.tensor([12, 10, 12, 9, 11, 12], dtype=torch.int32),
        prompt_lengths=torch.tensor([2, 3, 1, 2, 4, 2], dtype=torch.int32),
    )
    embed = torch.randn(50, 16, generator=generator)
    draft_ids = torch.arange(0, 50, 2)
    cfg = Eagle3LoopConfig(steps=8, batch_rows=2, lr=1e-2, warmup_steps=1, unroll_steps=2,
                           cls_stride=1, eval_every=0, checkpoint_every=2)  # fmt: skip
    head = _tiny_head(vocab=len(draft_ids)).float()
    return head, rows, embed, draft_ids, cfg


def test_a_killed_run_resumes_to_the_same_weights(tmp_path, monkeypatch) -> None:
    head, rows, embed, draft_ids, cfg = _resume_setup()
    train(head, rows, rows, embed, draft_ids, cfg, CPU, torch.Generator().manual_seed(0))
    straight = {k: v.clone() for k, v in head.state_dict().items()}

    head, *_ = _resume_setup()
    checkpoint = tmp_path / "checkpoint.pt"
    real_lr = eagle3_loop.cosine_lr

    def dies_at_step_5(step, *args):
        if step == 5:
            raise KeyboardInterrupt  # the run stops between checkpoints (saved at 4;
            # the data is reshuffled at step 6, so the generator state must come back too)
        return real_lr(step, *args)

    monkeypatch.setattr(eagle3_loop, "cosine_lr", dies_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        train(head, rows, rows, embed, draft_ids, cfg, CPU, torch.Generator().manual_seed(0),
              checkpoint, "recipe")  # fmt: skip
    assert torch.load(checkpoint, weights_only=False)["step"] == 4
    monkeypatch.setattr(eagle3_loop, "cosine_lr", real_lr)
    head, *_ = _resume_setup()  # a new run: fresh weights, the checkpoint on disk
    result = train(head, rows, rows, embed, draft_ids, cfg, CPU,
                   torch.Generator().manual_seed(0), checkpoint, "recipe")  # fmt: skip
    assert len(result.train_loss) == cfg.steps
    for name, value in head.state_dict().items():
        torch.testing.assert_close(value, straight[name], msg=name)
    # another recipe does not resume from it
    head, *_ = _resume_setup()
    fresh = train(head, rows, rows, embed, draft_ids, cfg, CPU,
                  torch.Generator().manual_seed(0), checkpoint, "other")  # fmt: skip
    assert fresh.evals[0]["step"] == 0 and len(fresh.train_loss) == cfg.steps


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--arch", "eagle3", "--aux-layers", "1,x"], "--aux-layers"),
        (["--arch", "eagle3", "--aux-layers", "1,1"], "--aux-layers"),
        (["--arch", "eagle3", "--draft-vocab-size", "-2"], "--draft-vocab-size"),
        (["--arch", "eagle4"], "--arch"),
    ],
)
def test_bad_eagle3_flags_are_argparse_errors(argv: list[str], flag: str, capsys) -> None:
    from tests.train.test_train_eagle import _parser

    with pytest.raises(SystemExit) as exit_info:
        _parser().parse_args(["train-eagle", "--target", "t", "--output", "x", *argv])
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("flag", [["--draft-vocab-size", "0"], ["--aux-layers", "1,2,3"]])
def test_eagle3_flags_need_the_eagle3_arch(flag: list[str]) -> None:
    from tests.train.test_train_eagle import _parser

    args = _parser().parse_args(["train-eagle", "--target", "t", "--output", "x", *flag])
    with pytest.raises(SystemExit, match=f"{flag[0]} needs --arch eagle3"):
        args.func(args)
