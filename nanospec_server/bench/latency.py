"""Table 4: one draft step's latency, broken down: `nanospec bench latency`.

Times, on this machine and outside the server, the parts of one draft step of a real
draft at batch 1: the backbone (one decode token over a KV cache; for an EAGLE head, its
fc over [token embedding, target hidden state] and its decoder layer), the LM head over
the full vocabulary, over an FR-Spec static 32k list and over NanoSpec's packed rows, the
gather that refreshes the packed rows (``DynamicVocab.refresh``) and the state update
(``DynamicVocab.append``). The stream is real text (Spec-Bench turns), tokenised by the
draft's tokenizer, appended as the serving path does: one prompt, then per step a
5-token tree and 3 x 5 verify predictions, advancing through the text.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
from torch import nn

from nanospec_server.vocab import DynamicVocab
from nanospec_server.vocab_tools.timing import head_topk, median_ms


def eagle_draft(
    head_dir: Path, target: nn.Module, dtype: torch.dtype
) -> tuple[nn.Module, nn.Linear]:
    """An EAGLE head as a decoder model and its fc: the head's decoder layer(s), the
    target's token embedding and LM head (SGLang's EAGLE worker shares both with the
    target). The norms are transformers' own where the head has none (elementwise: nothing
    a step's time notices)."""
    # deferred: imports safetensors, transformers only when called
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(head_dir))
    embedding = target.get_input_embeddings().weight
    if config.hidden_size != embedding.shape[1]:
        raise ValueError(
            f"{head_dir} has hidden size {config.hidden_size}, the target {embedding.shape[1]}"
        )
    config.tie_word_embeddings = False
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    state = {k: v.to(dtype) for k, v in load_file(str(head_dir / "model.safetensors")).items()}
    layers = {f"model.{k}": v for k, v in state.items() if k.startswith("layers.")}
    unexpected = model.load_state_dict(layers, strict=False).unexpected_keys
    if unexpected or not layers:
        raise ValueError(
            f"{head_dir} is not an EAGLE head of this shape: {unexpected or 'no layers'}"
        )
    model.model.embed_tokens.weight = embedding
    model.lm_head.weight = target.get_output_embeddings().weight
    weight = state["fc.weight"]
    fc = nn.Linear(weight.shape[1], weight.shape[0], bias="fc.bias" in state, dtype=dtype)
    fc.load_state_dict({k.removeprefix("fc."): v for k, v in state.items() if k.startswith("fc.")})
    return model, fc.eval()


def breakdown(model, stream: list[int], w_max: int = 3072, steps: int = 30,
              context: int = 512, static_k: int = 32768, fc: nn.Linear | None = None) -> dict:  # fmt: skip
    """Median milliseconds per part of a draft step (batch 1); with ``fc``, ``model`` is an
    EAGLE head (``eagle_draft``) whose backbone step also mixes in a hidden state."""
    # deferred: imports transformers only when called
    from transformers import DynamicCache

    weight = model.lm_head.weight.detach()
    vocab_size, _ = weight.shape
    prompt, rest = stream[:w_max], stream[w_max:]
    if len(rest) < steps * 20:
        raise ValueError(f"need {w_max + steps * 20} stream tokens, got {len(stream)}")
    vocab = DynamicVocab(weight, num_slots=2, w_cap=w_max, w_max=w_max, max_batch=1)
    slot = torch.tensor([1])
    vocab.append(slot, torch.tensor([prompt]))
    vocab.refresh(slot)

    cache = DynamicCache()
    with torch.no_grad():
        out = model.model(torch.tensor([stream[:context]]), past_key_values=cache, use_cache=True)
    hidden = out.last_hidden_state[:, -1]

    def backbone(token: torch.Tensor) -> object:
        if fc is None:
            return model.model(token, past_key_values=cache, use_cache=True)
        mixed = fc(torch.cat([model.model.embed_tokens(token), hidden[:, None]], dim=-1))
        return model.model(inputs_embeds=mixed, past_key_values=cache, use_cache=True)

    times: dict[str, list[float]] = {k: [] for k in
                                     ("backbone", "head_full", "head_static", "head_packed", "gather", "state_update")}  # fmt: skip
    static_rows = weight[: min(static_k, vocab_size)].contiguous()
    rows = []
    for i in range(steps):
        chunk = torch.tensor([rest[i * 20 : (i + 1) * 20]])
        with torch.no_grad():
            token = torch.tensor([[stream[context + i]]])
            times["backbone"].append(median_ms(lambda t=token: backbone(t), 1))
            cache.crop(-1)  # back to `context` tokens: every step alike
            times["head_full"].append(median_ms(lambda: head_topk(hidden, weight), 3))
            times["head_static"].append(median_ms(lambda: head_topk(hidden, static_rows), 3))
            times["state_update"].append(median_ms(lambda c=chunk: vocab.append(slot, c), 1))
            times["gather"].append(median_ms(lambda: vocab.refresh(slot), 1))
            times["head_packed"].append(median_ms(lambda: vocab.topk(hidden, slot, 8), 3))
            rows.append(vocab.rows_computed)
    result = {k: statistics.median(v) for k, v in times.items()}
    result |= {"packed_rows_mean": statistics.fmean(rows), "vocab_size": vocab_size,
               "static_k": static_rows.shape[0], "w_max": w_max, "context": context,
               "dtype": str(weight.dtype).removeprefix("torch."), "eagle": fc is not None}  # fmt: skip
    return result


def step_totals(b: dict) -> dict[str, dict[str, float]]:
    """Per configuration: draft step time and the LM head's share of it (no overlap on
    CPU: the gather runs on the same cores as the backbone)."""
    parts = {
        "full": {"backbone": b["backbone"], "lm_head": b["head_full"]},
        f"static-{b['static_k']}": {"backbone": b["backbone"], "lm_head": b["head_static"]},
        "nanospec": {
            "backbone": b["backbone"],
            "lm_head": b["head_packed"],
            "gather": b["gather"],
            "state_update": b["state_update"],
        },  # fmt: skip
    }
    return {name: {"total_ms": sum(p.values()), "lm_head_share": p["lm_head"] / sum(p.values())}
            for name, p in parts.items()}  # fmt: skip


def markdown(b: dict, command: str, model: str) -> str:
    totals = step_totals(b)
    lines = [f"# Draft step latency breakdown (Table 4): {model}", "", f"- command: `{command}`",
             f"- {'EAGLE head (fc + its decoder layer)' if b['eagle'] else 'the whole model'} as the backbone, "
             f"{b['dtype']}, batch 1, KV context {b['context']}, W_max {b['w_max']}, packed rows "
             f"{b['packed_rows_mean']:.0f} of {b['vocab_size']}, medians in ms", "",
             "| part | ms |", "|---|---|"]  # fmt: skip
    for key in ("backbone", "head_full", "head_static", "head_packed", "gather", "state_update"):
        lines.append(f"| {key} | {b[key]:.3f} |")
    lines += ["", "| configuration | draft step ms | LM-head share |", "|---|---|---|"]
    for name, t in totals.items():
        lines.append(f"| {name} | {t['total_ms']:.2f} | {t['lm_head_share']:.1%} |")
    return "\n".join(lines) + "\n"
