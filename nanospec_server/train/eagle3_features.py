"""Which target layers feed an EAGLE-3 head, and capturing them while the target answers.

SGLang 0.5.23 (``set_eagle3_layers_to_capture`` in models/llama.py and qwen2.py) captures,
by default, the residual stream entering decoder layers ``[2, L // 2, L - 3]``: low, middle
and high features. A head's config may name other layers as
``eagle_config.eagle_aux_hidden_state_layer_ids``; SGLang adds one to each id, because the
state entering layer i+1 is the output of layer i. The state entering layer c is what
transformers returns as ``hidden_states[c]`` with ``output_hidden_states`` (index 0 being
the embedding output); ``capture_inputs`` records it with hooks instead, so a decode step
keeps three states rather than all L + 1.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import nn


def capture_layers(num_layers: int, layer_ids: Sequence[int] | None = None) -> list[int]:
    """Indices of the decoder layers whose *input* SGLang captures (its ``layers_to_capture``).

    ``layer_ids``: the head's ``eagle_aux_hidden_state_layer_ids`` (None: SGLang's default).
    """
    if layer_ids is None:
        capture = [2, num_layers // 2, num_layers - 3]
        if not all(0 <= c < num_layers for c in capture) or len(set(capture)) < 3:
            raise ValueError(
                f"SGLang's default EAGLE-3 layers {capture} do not fit a {num_layers}-layer "
                "target; pass --aux-layers"
            )
        return capture
    capture = sorted(layer + 1 for layer in layer_ids)  # SGLang concatenates in layer order
    if not layer_ids or not all(0 <= c < num_layers for c in capture):
        raise ValueError(
            f"--aux-layers {list(layer_ids)}: each id must lie in [-1, {num_layers - 2}] "
            f"for a {num_layers}-layer target (SGLang captures the input of layer id + 1)"
        )
    return capture


def aux_layer_ids(capture: Sequence[int]) -> list[int]:
    """The config's ``eagle_aux_hidden_state_layer_ids`` for SGLang to capture ``capture``."""
    return [c - 1 for c in capture]


@contextmanager
def capture_inputs(model: nn.Module, capture: Sequence[int]) -> Iterator[list[torch.Tensor]]:
    """Hooks on ``model.layers[c]`` (a transformers base model) recording the hidden states
    entering each captured layer. Yields a list the hooks refill on every forward: read
    it with ``fused`` after each call."""
    seen: list[torch.Tensor] = []

    def record(index: int):
        def hook(_module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            seen.append((index, hidden))

        return hook

    handles = [
        model.layers[c].register_forward_pre_hook(record(slot), with_kwargs=True)
        for slot, c in enumerate(capture)
    ]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def fused(seen: list, count: int) -> torch.Tensor:
    """The captured states of the latest forward, concatenated low to high: [B, L, count*H].
    Empties ``seen`` for the next forward."""
    if len(seen) != count:
        raise RuntimeError(f"captured {len(seen)} layer inputs, expected {count}")
    states = [hidden for _, hidden in sorted(seen, key=lambda item: item[0])]
    seen.clear()
    return torch.cat(states, dim=-1)
