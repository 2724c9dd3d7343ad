"""Per-request NanoSpec statistics in every `/generate` response's `meta_info["nanospec"]`.

SGLang lets a `SchedulerOutputStreamer` subclass add fields to each emitted chunk; the
scheduler picks the class through `Scheduler.get_output_streamer_class`, which our hook
replaces. The statistics are read from the device here, once per chunk. Every batch
passes through `stream_output`, which is where the running requests are noted for
`/stats/vocab`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

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
        # response carries a snapshot per chunk and the last one is the latest.
        return {META_INFO_KEY: [[stats] for stats in current().runtime.snapshot(reqs)]}

    def is_request_level_customized_info_key(self, key: str) -> bool:
        return key == META_INFO_KEY
