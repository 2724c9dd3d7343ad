"""Response models of `/stats/vocab`, built from what each scheduler (DP rank) publishes.

The schedulers publish raw sums (`request_stats.Totals`); means are derived here so that
figures over several DP ranks are exact, not means of means.
"""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, Field

from nanospec_server.config import NanoSpecConfig


class RequestState(str, Enum):
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"  # a client that went away, /abort_request


class RequestEntry(BaseModel):
    """One request's NanoSpec figures (token counts only, never text)."""

    rid: str
    dp_rank: int = Field(description="data-parallel rank whose scheduler runs it")
    state: RequestState
    mode: str
    prompt_tokens: int
    output_tokens: int
    w_max: int | None = Field(description="window length in force at its latest step")
    active_vocab_size: int = Field(description="active vocabulary now (at finish if finished)")
    active_vocab_mean: float
    active_vocab_max: int
    coverage: float | None = Field(
        description="tokens emitted by draft steps that were in the active set"
    )
    head_vocab_coverage: float | None = Field(
        None,
        description="emitted tokens in the draft head's own vocabulary (an EAGLE-3 head's "
        "d2t list; 1 for a full-vocabulary head): the ceiling of coverage",
    )
    accept_length_mean: float | None = Field(description="tokens emitted per draft step")
    draft_steps: int
    plain_steps: int = Field(
        0, description="depth-0 steps on SGLang's plain decode path (one token each, no draft)"
    )
    catch_up_tokens: int = Field(
        0, description="tokens the draft ran over to catch up after depth-0 steps"
    )
    accepted_draft_tokens: int
    drafted_tokens: int | None = Field(
        None, description="draft tokens proposed: the sum of each step's depth as it ran"
    )
    lm_head_calls: int
    lm_head_rows_mean: float | None
    draft_ms_per_step: float | None = Field(
        None, description="the draft's wall time per speculative step (CPU servers only)"
    )
    lm_head_share: float | None = Field(
        None, description="the draft LM head's share of that time (CPU servers only)"
    )
    started_at: float = Field(description="Unix time the request reached a batch")
    finished_at: float | None = None


class Aggregates(BaseModel):
    """Totals over the requests that ended since start (finished or aborted: the steps of
    both ran), plus the requests running now. The raw sums travel along, so that figures
    over several DP ranks or several workers (`combine`) are exact, not means of means."""

    requests_finished: int
    requests_aborted: int
    requests_running: int
    prompt_tokens: int
    output_tokens: int
    draft_steps: int
    plain_steps: int = Field(0, description="depth-0 steps on the plain decode path")
    catch_up_tokens: int = Field(0, description="tokens the draft caught up on (raw sum)")
    emitted_tokens: int = Field(
        0, description="tokens emitted by the draft steps and the plain steps (raw sum)"
    )
    covered_tokens: int = Field(0, description="of them, in the active vocabulary (raw sum)")
    covered_by_head_tokens: int = Field(0, description="of them, in the head's own (raw sum)")
    active_vocab_sum: int = Field(0, description="active vocabulary summed over steps (raw sum)")
    active_vocab_mean: float | None = Field(description="per draft step, over all requests")
    coverage_mean: float | None
    head_vocab_coverage_mean: float | None = None
    accept_length_mean: float | None
    lm_head_rows_computed: int
    lm_head_rows_full_vocab: int = Field(description="what the full vocabulary would cost")
    lm_head_rows_saved_fraction: float | None
    state_bytes: int = Field(description="device memory of NanoSpec's per-request state")
    state_bytes_in_use: int = Field(
        description="the part held now: window slots of running requests, packed-head rows"
    )
    state_bytes_idle: int = Field(description="what `state_bytes_in_use` reads with none running")

    @classmethod
    def from_ranks(cls, ranks: list[dict]) -> Aggregates:
        def total(name: str) -> int:
            return sum(rank["totals"][name] for rank in ranks)

        def memory(name: str) -> int:
            return sum(rank.get("memory", {}).get(name, 0) for rank in ranks)

        return cls.from_sums(
            requests_finished=total("requests"),
            requests_aborted=total("aborted"),
            requests_running=sum(len(rank["running"]) for rank in ranks),
            prompt_tokens=total("prompt_tokens"),
            output_tokens=total("output_tokens"),
            draft_steps=total("draft_steps"),
            plain_steps=total("plain_steps"),
            catch_up_tokens=total("catch_up_tokens"),
            emitted_tokens=total("emitted_tokens"),
            covered_tokens=total("covered_tokens"),
            covered_by_head_tokens=total("covered_by_head_tokens"),
            active_vocab_sum=total("active_vocab_sum"),
            lm_head_rows_computed=total("lm_head_rows"),
            lm_head_rows_full_vocab=sum(
                rank["totals"]["lm_head_calls"] * rank["vocab_size"] for rank in ranks
            ),
            state_bytes=sum(rank["state_bytes"] for rank in ranks),
            state_bytes_in_use=memory("state_bytes_in_use"),
            state_bytes_idle=memory("state_bytes_idle"),
        )

    @classmethod
    def combine(cls, parts: list[Aggregates]) -> Aggregates:
        """The aggregates of several workers (or ranks) together: sums summed, means derived."""
        return cls.from_sums(
            **{name: sum(getattr(part, name) for part in parts) for name in SUMMED_FIELDS}
        )

    @classmethod
    def from_sums(cls, **sums: int) -> Aggregates:
        """Every figure from the raw sums (`SUMMED_FIELDS`): the one place means are derived."""
        steps = sums["draft_steps"]
        emitted = sums["emitted_tokens"] - sums["plain_steps"]  # by draft steps
        computed, full = sums["lm_head_rows_computed"], sums["lm_head_rows_full_vocab"]
        return cls(
            **sums,
            active_vocab_mean=sums["active_vocab_sum"] / steps if steps else None,
            coverage_mean=sums["covered_tokens"] / emitted if emitted else None,
            head_vocab_coverage_mean=(
                sums["covered_by_head_tokens"] / emitted if emitted else None
            ),
            accept_length_mean=emitted / steps if steps else None,
            lm_head_rows_saved_fraction=1 - computed / full if full else None,
        )


SUMMED_FIELDS = (
    "requests_finished", "requests_aborted", "requests_running", "prompt_tokens",
    "output_tokens", "draft_steps", "plain_steps", "catch_up_tokens", "emitted_tokens",
    "covered_tokens",
    "covered_by_head_tokens", "active_vocab_sum", "lm_head_rows_computed",
    "lm_head_rows_full_vocab", "state_bytes", "state_bytes_in_use", "state_bytes_idle",
)  # fmt: skip


ADAPTIVE_DESCRIPTION = (
    "adaptive speculation: the policy in force (`goodput` or `fixed`: --nanospec-adaptive "
    "with that --nanospec-adaptive-policy, `sglang`: --speculative-adaptive, `off`), the "
    "candidate depths, the depth in force, steps run per depth, the latest steps (batch "
    "size, depth, why, wall ms), for `goodput` the measured acceptance rate, the cost model "
    "T(b, k) = c0 + c1 b + c2 k + c3 b k in ms and the predicted tokens/s per depth of the "
    "latest decision, for `fixed` its depth and the measured acceptance rate"
)


class RankStats(BaseModel):
    dp_rank: int
    settings: NanoSpecConfig
    aggregates: Aggregates
    memory: dict[str, int] = Field(
        default_factory=dict,
        description="NanoSpec's device bytes by part (window, union buffer, slot map), the "
        "sizes behind them, how often a full union buffer left tokens out, and what "
        "requests hold now (`slots_in_use`, `union_rows_in_use` against `union_rows_idle`)",
    )
    adaptive: dict | None = Field(None, description=ADAPTIVE_DESCRIPTION)


class VocabStats(BaseModel):
    settings: NanoSpecConfig = Field(description="settings in force (DP rank 0)")
    vocab_size: int
    started_at: float
    history_size: int = Field(description="finished requests kept per rank")
    aggregates: Aggregates = Field(description="over every DP rank")
    ranks: list[RankStats]
    requests: list[RequestEntry] = Field(description="running first, then newest finished")
    adaptive: dict | None = Field(None, description=f"{ADAPTIVE_DESCRIPTION} (DP rank 0)")


def entries(rank: dict) -> list[RequestEntry]:
    rows = rank["running"] + rank["finished"][::-1]
    return [RequestEntry.model_validate(row | {"dp_rank": rank["dp_rank"]}) for row in rows]


def vocab_stats(
    ranks: list[dict], state: RequestState | None = None, limit: int | None = None
) -> VocabStats:
    requests = [entry for rank in ranks for entry in entries(rank)]
    requests.sort(key=lambda e: (e.state != RequestState.RUNNING, -(e.finished_at or 0)))
    if state is not None:
        requests = [entry for entry in requests if entry.state == state]
    first = ranks[0]
    return VocabStats(
        settings=NanoSpecConfig.model_validate(first["config"]),
        vocab_size=first["vocab_size"],
        started_at=min(rank["started_at"] for rank in ranks),
        history_size=first["history_size"],
        aggregates=Aggregates.from_ranks(ranks),
        ranks=[
            RankStats(
                dp_rank=rank["dp_rank"],
                settings=NanoSpecConfig.model_validate(rank["config"]),
                aggregates=Aggregates.from_ranks([rank]),
                memory=rank.get("memory", {}),
                adaptive=rank.get("adaptive"),
            )
            for rank in ranks
        ],
        requests=requests[:limit] if limit is not None else requests,
        adaptive=first.get("adaptive"),
    )
