"""Per-request NanoSpec statistics in every `/generate` response's `meta_info["nanospec"]`.

SGLang lets a `SchedulerOutputStreamer` subclass add fields to each emitted chunk; the
scheduler picks the class through `Scheduler.get_output_streamer_class`, which our hook
replaces. The statistics are read from the device here. SGLang's tokenizer manager sends a
streamed request every snapshot so far with each chunk, so a snapshot per chunk would cost
a device read per step and a reply quadratic in its length, serialised on the host the
scheduler decodes on: a streamed request gets its snapshot on its last chunk, or on
every chunk when it asks (`custom_params.nanospec_stats_every_chunk`). A reply that is
not streamed gets one each time SGLang emits it internally (every ~50 tokens) and at its
end. Every batch passes through `stream_output`, which is where the running requests are
noted for `/stats/vocab`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

from nanospec_server.config import wants_stats_every_chunk
from nanospec_server.sglang_plugin.spec.step_context import current

META_INFO_KEY = "nanospec"


@dataclass(kw_only=True, slots=True)
class NanoSpecOutputStreamer(SchedulerOutputStreamer):
    has_additional_customized_info: ClassVar[bool] = True

    def stream_output(self, reqs, return_logprob: bool, skip_req=None):
        rt = current().runtime
        if rt is not None and self.is_generation:
            live = rt.config.w_max if rt.vocab is not None else None
            reqs_now = (req for req in reqs if req is not skip_req)
            rt.stats.track(reqs_now, live, rt.w_max_in_force)
        SchedulerOutputStreamer.stream_output(self, reqs, return_logprob, skip_req)

    def should_build_additional_customized_info(self) -> bool:
        return current().runtime is not None

    def build_additional_customized_info(self, reqs) -> dict[str, list]:
        # One entry per request; SGLang appends each chunk's list to meta_info, so the
        # response carries the snapshots sent so far and the last one is the latest.
        due = [i for i, req in enumerate(reqs) if snapshot_due(req)]
        snapshots = current().runtime.snapshot([reqs[i] for i in due]) if due else []
        entries: list[list] = [[] for _ in reqs]
        for i, stats in zip(due, snapshots, strict=True):
            entries[i] = [stats]
        return {META_INFO_KEY: entries}

    def is_request_level_customized_info_key(self, key: str) -> bool:
        return key == META_INFO_KEY


def snapshot_due(req) -> bool:
    """Whether this chunk of the request carries a statistics snapshot."""
    if req.finished() or not req.stream:
        return True
    return wants_stats_every_chunk(req.sampling_params.custom_params)
