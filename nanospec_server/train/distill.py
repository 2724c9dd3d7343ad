"""Self-distillation rows: the target answers a prompt greedily; every position's
final-normed hidden state is kept.

Why the target's own answers: greedy verification accepts exactly the target's
argmax, so text the target wrote is the distribution the draft must imitate, and
the hidden states come for free while generating (one target pass per token
instead of a generation pass plus a teacher-forced pass). A row is
``prompt + answer`` cut at ``seq_len`` or just before an end-of-sequence token,
right-padded; ``lengths`` and ``prompt_lengths`` say which positions are real.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, fields

import torch

from nanospec_server.train.eagle3_features import capture_inputs, fused


@dataclass
class DistilledRows:
    input_ids: torch.Tensor  # [rows, seq_len] int32, right-padded with 0
    # [rows, seq_len, d] bf16, zeros past the length: the final-normed state (EAGLE-1), or
    # the fused states entering the captured layers (EAGLE-3, d = layers * hidden)
    hidden: torch.Tensor
    lengths: torch.Tensor  # [rows] int32: real tokens in the row
    prompt_lengths: torch.Tensor  # [rows] int32: of those, the prompt's

    def select(self, index: torch.Tensor | slice) -> DistilledRows:
        return DistilledRows(*(getattr(self, f.name)[index] for f in fields(self)))

    @classmethod
    def cat(cls, parts: Sequence[DistilledRows]) -> DistilledRows:
        return cls(*(torch.cat([getattr(p, f.name) for p in parts]) for f in fields(cls)))


@torch.inference_mode()
def generate_rows(
    target, prompts: list[list[int]], seq_len: int, eos_ids: set[int], device: torch.device,
    aux_layers: Sequence[int] | None = None,
) -> DistilledRows:  # fmt: skip
    """Greedy answers to a batch of ``prompts`` (token ids, each shorter than ``seq_len``).

    Prompts are left-padded for the batched forward; positions count real tokens
    only, so each row's hidden states are those of the prompt alone. A row leaves
    the batch (and its KV cache) when it says EOS or fills ``seq_len``. On a CPU a
    decode step costs about the same for 4 rows as for 32 (it reads every weight
    once), so when fewer than a quarter of the rows are left the rest are cut
    short: a truncated answer is still the target's own text.

    ``aux_layers``: keep, instead of the final state, the states entering these decoder
    layers, concatenated (``eagle3_features.capture_inputs``).
    """
    capturing = capture_inputs(target.model, aux_layers) if aux_layers else nullcontext()
    with capturing as seen:
        return _generate(target, prompts, seq_len, eos_ids, device, aux_layers, seen)


def _generate(target, prompts, seq_len, eos_ids, device, aux_layers, seen) -> DistilledRows:
    # deferred: imports transformers only when called
    from transformers import DynamicCache

    def kept(out) -> torch.Tensor:
        return fused(seen, len(aux_layers)) if aux_layers else out.last_hidden_state

    batch, width = len(prompts), max(map(len, prompts))
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    out = target.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                       past_key_values=cache, use_cache=True)  # fmt: skip

    prompt_states = kept(out)
    prompt_lengths = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
    rows = DistilledRows(
        input_ids=torch.zeros(batch, seq_len, dtype=torch.int32),
        hidden=torch.zeros(batch, seq_len, prompt_states.shape[-1], dtype=torch.bfloat16),
        lengths=prompt_lengths.clone(),
        prompt_lengths=prompt_lengths,
    )
    prompt_hidden = prompt_states.to(torch.bfloat16).cpu()
    for row, prompt in enumerate(prompts):
        rows.input_ids[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.int32)
        rows.hidden[row, : len(prompt)] = prompt_hidden[row, width - len(prompt) :]

    eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)
    live = torch.arange(batch)  # original row of each batch entry still generating
    last = out.last_hidden_state[:, -1]
    next_pos = positions[:, -1:] + 1
    stop_below = batch // 4
    while len(live) > stop_below:
        token = target.lm_head(last).argmax(-1)
        # A row keeps a token only with its hidden state (the training pair needs
        # both), so it stops before EOS: the state of the token before EOS already
        # says, through its argmax, that EOS comes next.
        keep = ~torch.isin(token, eos)
        keep &= (rows.lengths[live] < seq_len).to(device)
        if not bool(keep.all()):
            chosen = keep.nonzero().flatten()
            cache.batch_select_indices(chosen)
            live, token = live[chosen.cpu()], token[chosen]
            mask, next_pos = mask[chosen], next_pos[chosen]
            if not len(live):
                break
        mask = torch.cat([mask, torch.ones(len(live), 1, dtype=mask.dtype, device=device)], dim=1)
        out = target.model(input_ids=token[:, None], attention_mask=mask, position_ids=next_pos,
                           past_key_values=cache, use_cache=True)  # fmt: skip
        last = out.last_hidden_state[:, -1]
        columns = rows.lengths[live].long()
        rows.input_ids[live, columns] = token.to(torch.int32).cpu()
        rows.hidden[live, columns] = kept(out)[:, -1].to(torch.bfloat16).cpu()
        rows.lengths[live] += 1
        next_pos = next_pos + 1
    return rows
