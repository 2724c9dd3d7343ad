"""Hypothesis bodies for the API fuzzer's constrained-sampling run: `/generate` requests that
always carry a grammar and mostly sample, with the fields that mask or push down tokens
(`min_new_tokens`, stop ids, penalties, logit bias, top-k/top-p/min-p) drawn together.

Schema-driven cases rarely combine them: a grammar is one branch of four, temperature 0 is
a favoured boundary, and each optional field is left out half the time, so a sampled
grammar request with `min_new_tokens` past the grammar's end and stop ids came too seldom
to be found. Here every case has a grammar, short grammars (one token, then only the end)
are common, and sampling is the rule.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from nanospec_server.models.tiny.tokenizer import BOS_ID, EOS_ID, VOCAB_SIZE

MAX_NEW_TOKENS = 8

GRAMMARS = [
    {"json_schema": '{"type": "object"}'},
    {"json_schema": '{"const": 1}'},
    {"json_schema": '{"type": "string", "maxLength": 3}'},
    {"json_schema": '{"type": "integer"}'},
    {"regex": "a"},
    {"regex": "[ab]{1,3}"},
    {"regex": "(ab|cd)*"},
    {"ebnf": 'root ::= "a" | "b"'},
    {"ebnf": 'root ::= "x" "y"'},
]

_token = st.integers(0, VOCAB_SIZE - 1)
# Tiny and huge magnitudes within each field's range, as well as ordinary ones.
_penalty = st.one_of(st.floats(-2, 2), st.sampled_from([5e-175, -5e-175, 2.0, -2.0]))
_bias = st.one_of(st.floats(-100, 100), st.sampled_from([9e-299, -1e30, 1e30, -3e38]))
_OPTIONAL = {
    "top_k": st.one_of(st.just(-1), st.integers(1, 50)),
    "top_p": st.floats(0.05, 1.0),
    "min_p": st.floats(0.0, 1.0),
    "frequency_penalty": _penalty,
    "presence_penalty": _penalty,
    "repetition_penalty": st.floats(0.5, 2.0),
    "logit_bias": st.dictionaries(_token.map(str), _bias, max_size=4),
    # EOS among the stop ids often: min_new_tokens masks it as well.
    "stop_token_ids": st.lists(st.one_of(st.just(EOS_ID), _token), max_size=4),
    "ignore_eos": st.booleans(),
}


@st.composite
def sampling_params(draw: st.DrawFn) -> dict[str, Any]:
    params: dict[str, Any] = dict(draw(st.sampled_from(GRAMMARS)))
    params["max_new_tokens"] = draw(st.integers(1, MAX_NEW_TOKENS))
    params["min_new_tokens"] = draw(st.integers(0, params["max_new_tokens"]))
    params["temperature"] = draw(st.one_of(st.floats(0.05, 2.0), st.sampled_from([0.0, 0.39, 1.0])))
    for name, values in _OPTIONAL.items():
        if draw(st.booleans()):
            params[name] = draw(values)
    return params


def constrained_bodies() -> st.SearchStrategy[dict[str, Any]]:
    prompt = st.lists(_token, min_size=0, max_size=24).map(lambda ids: [BOS_ID, *ids])
    return st.fixed_dictionaries({"input_ids": prompt, "sampling_params": sampling_params()})
