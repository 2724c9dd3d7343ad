"""The OpenAPI schema the API fuzzer generates from: the server's own, narrowed.

SGLang's request schemas are large and loose (`GenerateReqInput` has ~80 fields, most of
them multimodal, disaggregation or LoRA knobs that a tiny text model rejects at once), so
cases generated from them are mostly rejected before they reach the model, and chat
bodies are slow enough to trip Hypothesis' health checks. We keep the served schema of the
routes we fuzz and replace the three generation bodies with the fields a text request
uses, bounded so that a case generates a few tokens of the tiny models (their vocabulary,
small max_new_tokens / max_tokens, small n) and carries NanoSpec's `custom_params.w_max`.
Negative cases (schemathesis' NEGATIVE mode) break these bounds on purpose.
"""

from __future__ import annotations

import copy
from typing import Any

from nanospec_server.models.tiny.tokenizer import VOCAB_SIZE

MAX_NEW_TOKENS = 8  # a case generates a few tokens: fast even on a loaded 2-core host
RIDS = [f"fuzz-{i}" for i in range(4)]  # ids the generation cases use, so rid lookups can hit

# The routes fuzzed, by path and method, each with the modes it is fuzzed in: NEGATIVE
# needs something to break (a parameter or a body); a GET without parameters has nothing.
# Generation first, so that the request lookups can find the fuzzed requests' ids.
OPERATIONS = [
    ("/generate", "post", ("positive", "negative")),
    ("/v1/completions", "post", ("positive", "negative")),
    ("/v1/chat/completions", "post", ("positive", "negative")),
    ("/nanospec/settings", "post", ("positive", "negative")),
    ("/nanospec/settings", "get", ("positive",)),
    ("/nanospec/config", "get", ("positive",)),
    ("/stats/vocab", "get", ("positive", "negative")),
    ("/stats/vocab/{rid}", "get", ("positive",)),  # any string is a valid id
    ("/dashboard", "get", ("positive", "negative")),
]

_TOKEN_ID = {"type": "integer", "minimum": 0, "maximum": VOCAB_SIZE - 1}
_TOKEN_IDS = {"type": "array", "items": _TOKEN_ID, "minItems": 1, "maxItems": 48}
_SHORT_TEXT = {"type": "string", "maxLength": 80}
_TEXT = {"type": "string", "minLength": 1, "maxLength": 80}  # an empty prompt is a 400
_STOP = {
    "anyOf": [_SHORT_TEXT, {"type": "array", "items": _SHORT_TEXT, "maxItems": 3}, {"type": "null"}]
}
_PROB = {"type": "number", "minimum": 0, "maximum": 1}
_PENALTY = {"type": "number", "minimum": -2, "maximum": 2}
_LOGIT_BIAS = {
    "type": "object",
    "propertyNames": {"pattern": "^[1-9][0-9]{0,2}$"},  # token ids of the tiny vocabulary
    "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
    "maxProperties": 3,
}
_RID = {"anyOf": [{"enum": RIDS}, {"type": "null"}]}
# Valid patterns and broken ones (a broken one must be a 400).
_REGEX = {"enum": ["[a-z ]+", "(ab|cd)*", "("]}
# Constrained decoding (xgrammar) takes at most one grammar: each body is one of these.
# Short ones ("a", a constant) end after a token: min_new_tokens then masks every token.
_GRAMMARS: list[dict[str, Any]] = [
    {},
    {"regex": {"enum": [*_REGEX["enum"], "a"]}},
    {
        "json_schema": {
            "enum": ['{"type": "object"}', '{"type": "string"}', '{"const": 1}', "{not json"]
        }
    },
    {"ebnf": {"enum": ['root ::= "a" | "b"', "root ::= "]}},
]
_NULLABLE_INT = {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 20}, {"type": "null"}]}


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _one_of(*variants: dict[str, Any]) -> dict[str, Any]:
    return {"oneOf": list(variants)}


def _custom_params(w_cap: int) -> dict[str, Any]:
    """NanoSpec's per-request W_max: an int from 1 to the launch capacity, or null."""
    w_max = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": w_cap}, {"type": "null"}]}
    return {"anyOf": [_object({"w_max": w_max}, []), {"type": "null"}]}


def _sampling_fields(w_cap: int) -> dict[str, Any]:
    """Sampling fields /generate's `sampling_params` and the OpenAI bodies share."""
    return {
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"anyOf": [{"const": -1}, {"type": "integer", "minimum": 1, "maximum": 50}]},
        "min_p": _PROB,
        "frequency_penalty": _PENALTY,
        "presence_penalty": _PENALTY,
        "repetition_penalty": {"type": "number", "minimum": 0.5, "maximum": 2},
        "stop": _STOP,
        "stop_token_ids": {"type": "array", "items": _TOKEN_ID, "maxItems": 3},
        "stop_regex": {"anyOf": [_REGEX, {"type": "null"}]},
        "ignore_eos": {"type": "boolean"},
        "skip_special_tokens": {"type": "boolean"},
        "no_stop_trim": {"type": "boolean"},
        "logit_bias": _LOGIT_BIAS,
        "custom_params": _custom_params(w_cap),
        "n": {"type": "integer", "minimum": 1, "maximum": 2},
    }


def generate_body(w_cap: int) -> dict[str, Any]:
    """Text or token ids, a sampling_params object with at most one grammar."""
    sampling = _sampling_fields(w_cap) | {
        "max_new_tokens": {"type": "integer", "minimum": 0, "maximum": MAX_NEW_TOKENS},
        "min_new_tokens": {"type": "integer", "minimum": 0, "maximum": 4},
    }
    params = _one_of(*(_object(sampling | g, ["max_new_tokens"]) for g in _GRAMMARS))
    common = {
        "sampling_params": params,
        "stream": {"type": "boolean"},
        "return_logprob": {"type": "boolean"},
        "top_logprobs_num": {"type": "integer", "minimum": 0, "maximum": 20},
        "token_ids_logprob": {"type": "array", "items": _TOKEN_ID, "maxItems": 4},
        "logprob_start_len": {"type": "integer", "minimum": -1, "maximum": 64},
        "return_text_in_logprobs": {"type": "boolean"},
        "lora_path": {"anyOf": [_SHORT_TEXT, {"type": "null"}]},
        "data_parallel_rank": {"anyOf": [{"enum": [0, 1]}, {"type": "null"}]},  # 1: no such rank
        "priority": {
            "anyOf": [{"type": "integer", "minimum": -10, "maximum": 10}, {"type": "null"}]
        },
        "rid": {"enum": RIDS},
    }
    return _one_of(
        _object(common | {"text": _SHORT_TEXT}, ["text", "sampling_params"]),
        _object(common | {"input_ids": _TOKEN_IDS}, ["input_ids", "sampling_params"]),
    )


def _openai_fields(w_cap: int) -> dict[str, Any]:
    return _sampling_fields(w_cap) | {
        "model": {"enum": ["default"]},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": MAX_NEW_TOKENS},
        "min_tokens": {"type": "integer", "minimum": 0, "maximum": 4},
        "stream": {"type": "boolean"},
        "stream_options": {
            "anyOf": [_object({"include_usage": {"type": "boolean"}}, []), {"type": "null"}]
        },
        "seed": {
            "anyOf": [{"type": "integer", "minimum": 0, "maximum": 2**31 - 1}, {"type": "null"}]
        },
        "user": {"anyOf": [_SHORT_TEXT, {"type": "null"}]},
        "response_format": {
            "anyOf": [
                _object({"type": {"enum": ["text", "json_object"]}}, ["type"]),
                {"type": "null"},
            ]
        },
        "rid": _RID,
    }


def completions_body(w_cap: int) -> dict[str, Any]:
    fields = _openai_fields(w_cap) | {
        "prompt": {
            "anyOf": [
                _TEXT,
                {"type": "array", "items": _TEXT, "minItems": 1, "maxItems": 2},
                _TOKEN_IDS,
            ]
        },
        "echo": {"type": "boolean"},
        "logprobs": _NULLABLE_INT,
        "suffix": {"anyOf": [_SHORT_TEXT, {"type": "null"}]},
        "return_token_ids": {"type": "boolean"},
    }
    return _one_of(*(_object(fields | g, ["prompt", "max_tokens"]) for g in _GRAMMARS))


def chat_body(w_cap: int) -> dict[str, Any]:
    message = _object(
        {"role": {"enum": ["system", "user", "assistant"]}, "content": _SHORT_TEXT},
        ["role", "content"],
    )
    fields = _openai_fields(w_cap) | {
        "messages": {"type": "array", "items": message, "minItems": 1, "maxItems": 3},
        "logprobs": {"type": "boolean"},
        "top_logprobs": _NULLABLE_INT,
        "continue_final_message": {"type": "boolean"},
        "tool_choice": {"enum": ["auto", "none"]},
    }
    return _one_of(*(_object(fields | g, ["messages", "max_tokens"]) for g in _GRAMMARS))


def narrowed_schema(served: dict[str, Any], w_cap: int) -> dict[str, Any]:
    """`served` (the server's /openapi.json) cut to OPERATIONS, with targeted bodies."""
    schema = copy.deepcopy(served)
    schema["paths"] = {}
    for path, method, _ in OPERATIONS:
        operation = copy.deepcopy(served["paths"][path][method])
        schema["paths"].setdefault(path, {})[method] = operation
    # Known ids as well as other strings, so that lookups also find requests. (The other
    # branch must not contain the ids: schemathesis would merge the enum into it.)
    (rid,) = schema["paths"]["/stats/vocab/{rid}"]["get"]["parameters"]
    rid["schema"] = {"anyOf": [{"enum": RIDS}, {"type": "string", "pattern": "^[^f]"}]}
    bodies = {
        "/generate": generate_body(w_cap),
        "/v1/completions": completions_body(w_cap),
        "/v1/chat/completions": chat_body(w_cap),
    }
    for path, body in bodies.items():
        content = {"application/json": {"schema": body}}
        schema["paths"][path]["post"]["requestBody"] = {"required": True, "content": content}
    # The live settings: a W_max above the capacity is a documented 400, not a valid body.
    settings = schema["paths"]["/nanospec/settings"]["post"]["requestBody"]["content"]
    w_max = settings["application/json"]["schema"]["properties"]["w_max"]["anyOf"][0]
    w_max["maximum"] = w_cap
    return schema
