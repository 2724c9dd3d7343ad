"""NanoSpec settings shared by the CLI, the SGLang plugin and the admin layer.

The CLI validates them once and hands them to SGLang's subprocesses through one
environment variable, because SGLang's ``ServerArgs`` has no room for plugin fields
and every process it spawns inherits the launcher's environment.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nanospec_server.adaptive.registry import policy_names
from nanospec_server.env import config_json

DEFAULT_HISTORY = 1024


# A request's own W_max travels in SGLang's `custom_params` sampling parameter under this key.
REQUEST_W_MAX_PARAM = "w_max"


def requested_w_max(custom_params: object) -> int | None:
    """The W_max a request asked for, or None. The tokenizer side refuses bad values with a
    400 before they reach a scheduler; here anything that is not a positive int is None."""
    value = custom_params.get(REQUEST_W_MAX_PARAM) if isinstance(custom_params, dict) else None
    return value if type(value) is int and value >= 1 else None


# A streamed request that wants its statistics on every chunk, not on its last one only.
REQUEST_STATS_EVERY_CHUNK_PARAM = "nanospec_stats_every_chunk"


def wants_stats_every_chunk(custom_params: object) -> bool:
    """Whether a request asked for a statistics snapshot on every streamed chunk (a bool;
    the tokenizer side refuses anything else with a 400)."""
    if not isinstance(custom_params, dict):
        return False
    return custom_params.get(REQUEST_STATS_EVERY_CHUNK_PARAM) is True


class Mode(str, Enum):
    """How the draft model's LM head is computed."""

    FULL = "full"  # stock EAGLE: the whole vocabulary
    STATIC = "static"  # FR-Spec: a fixed top-k frequency vocabulary (--speculative-token-map)
    NANOSPEC = "nanospec"  # dynamic per-request vocabulary, gather overlapped with the backbone
    CTX_ONLY = "ctx-only"  # ablation: prompt tokens and prefill candidates only
    EXT_ONLY = "ext-only"  # ablation: draft-tree and verify candidates only
    SYNC = "sync"  # ablation: dynamic vocabulary, gather on the compute stream

    @property
    def is_dynamic(self) -> bool:
        return self not in (Mode.FULL, Mode.STATIC)


class NanoSpecConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Mode = Mode.NANOSPEC
    w_max: int = Field(3072, ge=1, description="window length, in candidate-stream positions")
    w_cap: int = Field(3072, ge=1, description="capacity fixed at allocation; bounds live W_max")
    k_pre: int = Field(3, ge=0, le=64, description="target top-k per prompt position")
    k_ver: int = Field(3, ge=0, le=64, description="target top-k per accepted verify position")
    union_capacity: int | None = Field(
        None, ge=1, description="rows of the packed draft head (default: 8 full windows)"
    )
    # Hybrid vocabulary: I ∪ P, P = the prior_k most frequent tokens of a fixed corpus
    # (vocab_tools/prior.py), pinned like EOS; 0 is the paper's method.
    prior_k: int = Field(0, ge=0, description="static prior tokens added to every active set")
    # Adaptive speculation (sglang_plugin/spec/adaptive.py): each step's draft depth, 0 to the
    # launch's, from the batch size, the measured acceptance and a per-host cost model.
    adaptive: bool = Field(False, description="choose each step's draft depth (goodput)")
    # On because it is the default (not asked for): where the server cannot run it (attention
    # DP, two-batch overlap, ...), it drafts at the fixed depth with a log line instead of
    # refusing to start.
    adaptive_by_default: bool = Field(
        False, description="adaptive speculation is on by default, not asked for (start-time)"
    )
    # Which depth policy chooses (adaptive/registry.py): "goodput" or "fixed".
    adaptive_policy: str = Field("goodput", description="the depth policy, by registry name")
    # Pins every step's depth to one of the candidates (-1: the policy chooses): for
    # measuring one depth's cost and for tests that switch the depth at known steps.
    adaptive_depth: int = Field(-1, ge=-1, description="pinned draft depth (-1: none)")
    # At depth 0 skip the draft model's extend pass unless the next step drafts
    # (sglang_plugin/spec/adaptive.py): a run of depth-0 steps then costs plain decodes, and the
    # draft's KV cache misses that run's tokens but the last (lossless all the same; fewer
    # drafts accepted for the requests that lived through it); a prefill into a batch the
    # policy would run at depth 0 skips NanoSpec's top-K_pre the same way. False: every
    # extend and every top-K_pre runs.
    adaptive_skip_extend: bool = Field(
        True, description="at depth 0, the draft extend only before a drafting step (start-time)"
    )
    # A depth-0 step runs SGLang's plain decode path (sglang_plugin/spec/plain_step.py) on a
    # CPU; False runs it as SGLang's one-node verify (the reference its cost is measured by).
    adaptive_plain: bool = Field(
        True, description="at depth 0, SGLang's plain decode step (start-time)"
    )

    # A cost-model calibration file the goodput policy starts from (adaptive/calibration.py),
    # written from an earlier server's /stats/vocab on this host: no exploring at start.
    adaptive_calibration: str | None = Field(
        None, description="the goodput policy's starting step timings, a file (start-time)"
    )

    @field_validator("adaptive_policy")
    @classmethod
    def _known_policy(cls, name: str) -> str:
        if name not in policy_names():
            raise ValueError(f"unknown depth policy {name!r}; known: {', '.join(policy_names())}")
        return name

    @model_validator(mode="after")
    def _w_max_fits(self) -> NanoSpecConfig:
        if self.w_max > self.w_cap:
            raise ValueError(f"w_max ({self.w_max}) must not exceed w_cap ({self.w_cap})")
        return self

    def to_env(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_env(cls) -> NanoSpecConfig:
        raw = config_json()
        return cls.model_validate_json(raw) if raw else cls()
