"""Refuse requests that would crash the scheduler, before they reach it.

SGLang 0.5.23 passes raw `input_ids` to the model unchecked: an id outside the vocabulary
makes the embedding lookup raise inside the scheduler, which takes the whole server (and
every request in flight) down. A BEFORE hook on the tokenizer manager's per-request
validation turns that into a 400 for the one bad request.
"""

from __future__ import annotations


def check_input_ids(tokenizer_manager, obj, input_ids, *args, **kwargs) -> None:
    if not input_ids:
        return
    vocab_size = tokenizer_manager.model_config.vocab_size
    low, high = min(input_ids), max(input_ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"input_ids: token id {bad} is outside the vocabulary [0, {vocab_size})")
