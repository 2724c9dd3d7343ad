"""Refuse bad requests before they reach the scheduler, with a 400 naming the field.

BEFORE hooks on the tokenizer manager's per-request validation, whose ValueError SGLang
answers with a 400.

SGLang 0.5.23 passes raw `input_ids` to the model unchecked: an id outside the vocabulary
makes the embedding lookup raise inside the scheduler, which takes the whole server (and
every request in flight) down. A request's own W_max (`custom_params.w_max`) is checked
like the live setting, against the capacity this server was launched with. A `stop_regex`
that is no regular expression is refused here too: SGLang 0.5.23 parses it after
validation, and `re.error` is no ValueError, so it was a 500 (found by the API fuzzer).
A `temperature` or `logit_bias` value that float32 cannot hold is refused as well: it
becomes inf in the sampler, and what cannot be known before a step (a row that the
request's constraints empty) is `no_token_left.py`'s.
"""

from __future__ import annotations

import math
import re

from nanospec_server.config import (
    REQUEST_STATS_EVERY_CHUNK_PARAM,
    REQUEST_W_MAX_PARAM,
    NanoSpecConfig,
)

W_MAX_FIELD = f"custom_params.{REQUEST_W_MAX_PARAM}"


def check_input_ids(tokenizer_manager, obj, input_ids, *args, **kwargs) -> None:
    if not input_ids:
        return
    vocab_size = tokenizer_manager.model_config.vocab_size
    low, high = min(input_ids), max(input_ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"input_ids: token id {bad} is outside the vocabulary [0, {vocab_size})")


def _custom_params(obj) -> dict | None:
    """The request's `sampling_params.custom_params` if it is an object, else None."""
    params = getattr(obj, "sampling_params", None)
    custom = params.get("custom_params") if isinstance(params, dict) else None
    return custom if isinstance(custom, dict) else None


def check_w_max_override(tokenizer_manager, obj, *args, **kwargs) -> None:
    custom = _custom_params(obj)
    if custom is None or custom.get(REQUEST_W_MAX_PARAM) is None:
        return
    from nanospec_server.admin.routes import w_max_problem

    config = NanoSpecConfig.from_env()
    if not tokenizer_manager.server_args.speculative_algorithm:
        raise ValueError(f"{W_MAX_FIELD}: this server does not decode speculatively")
    if not config.mode.is_dynamic:
        raise ValueError(
            f"{W_MAX_FIELD}: --nanospec-mode {config.mode.value} has no window; W_max "
            "applies to the dynamic modes (nanospec, ctx-only, ext-only, sync)"
        )
    if problem := w_max_problem(custom[REQUEST_W_MAX_PARAM], config.w_cap):
        raise ValueError(f"custom_params.{problem}")


def check_stats_every_chunk(tokenizer_manager, obj, *args, **kwargs) -> None:
    """`custom_params.nanospec_stats_every_chunk` is a bool or absent."""
    custom = _custom_params(obj)
    if custom is None or REQUEST_STATS_EVERY_CHUNK_PARAM not in custom:
        return
    if not isinstance(custom[REQUEST_STATS_EVERY_CHUNK_PARAM], bool):
        raise ValueError(f"custom_params.{REQUEST_STATS_EVERY_CHUNK_PARAM}: must be true or false")


def check_stop_regex(tokenizer_manager, obj, *args, **kwargs) -> None:
    """Compile every `sampling_params.stop_regex` as the scheduler's `re.search` will."""
    params = getattr(obj, "sampling_params", None)
    patterns = params.get("stop_regex") if isinstance(params, dict) else None
    if isinstance(patterns, str):
        patterns = [patterns]
    if not isinstance(patterns, list):
        return  # None, or a type SGLang's own checks refuse
    for pattern in patterns:
        if not isinstance(pattern, str):
            continue
        try:
            re.compile(pattern)
        except (re.error, OverflowError, RecursionError) as error:
            raise ValueError(
                f"sampling_params.stop_regex: {pattern!r} is not a regular expression: {error}"
            ) from error


FLOAT32_MAX = 3.4028234663852886e38  # the sampler's logits, bias and temperatures are fp32


def check_float32_sampling_values(tokenizer_manager, obj, *args, **kwargs) -> None:
    """`temperature` and `logit_bias` values the sampler's float32 tensors can hold: past
    +-3.4e38 they become inf, and inf - inf leaves a row with no distribution to sample."""
    params = getattr(obj, "sampling_params", None)
    if not isinstance(params, dict):
        return
    temperature = params.get("temperature")
    if _is_number(temperature) and not _fits_float32(temperature):
        raise ValueError(
            f"sampling_params.temperature: {temperature} is not a finite float32 number"
        )
    bias = params.get("logit_bias")
    if not isinstance(bias, dict):
        return
    for token, value in bias.items():
        if _is_number(value) and not _fits_float32(value):
            raise ValueError(
                f"sampling_params.logit_bias: the bias {value} of token {token} is not a "
                "finite float32 number"
            )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fits_float32(value: float) -> bool:
    return math.isfinite(value) and abs(value) <= FLOAT32_MAX
