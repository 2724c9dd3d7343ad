"""Hooks that only make sense inside a scheduler process, installed when one starts."""

from __future__ import annotations

import logging

from nanospec_server import seams
from nanospec_server.sglang_plugin.spec.verify_capture import eagle_sample_hook

logger = logging.getLogger(__name__)


def install_scheduler_hooks(scheduler, server_args, *args, **kwargs) -> None:
    """BEFORE hook on `Scheduler.__init__`: CPU threads and malloc thresholds, then our classes
    for this process."""
    if getattr(install_scheduler_hooks, "done", False):
        return
    install_scheduler_hooks.done = True
    if server_args.device == "cpu":
        import torch

        from nanospec_server.env import cpu_keep_freed
        from nanospec_server.host import scheduler_cpu_threads
        from nanospec_server.sglang_plugin.cpu.heap import keep_freed_memory

        ranks = server_args.tp_size * server_args.dp_size * server_args.pp_size
        torch.set_num_threads(scheduler_cpu_threads(ranks))
        if cpu_keep_freed():
            keep_freed_memory()
        from nanospec_server.sglang_plugin.cpu.linear import install_cpu_linear_hooks
        from nanospec_server.sglang_plugin.cpu.parallel import install_cpu_parallel_hooks

        install_cpu_parallel_hooks()
        install_cpu_linear_hooks()
        seams.apply()  # before the groups and the model, with or without speculation
    from nanospec_server.sglang_plugin.requests import grammar_conflict, no_token_left
    from nanospec_server.sglang_plugin.stats import forward_log

    forward_log.register_hooks()  # every server, plain decoding's too: off unless asked
    grammar_conflict.register_hooks()  # every server: a client's clash is a 400, not a 500
    if server_args.device == "cpu":
        # A request that leaves no token to sample ends alone, not the scheduler. CPU only:
        # the guard reads a flag on the host every step, a sync CUDA's overlap would pay for.
        no_token_left.register_hooks(speculative=bool(server_args.speculative_algorithm))
    if not server_args.speculative_algorithm:
        seams.apply()
        return
    from nanospec_server.sglang_plugin.spec.step_context import current
    from nanospec_server.sglang_plugin.stats import live_settings, metrics, output_streamer

    current().scheduler = scheduler  # read once built: how many requests wait to join

    if server_args.enable_metrics:
        metrics.enable(metrics.worker_name(server_args.host, server_args.port))
    from nanospec_server.sglang_plugin.spec.draft_worker import (
        NanoSpecEagleDraftWorker,
        NanoSpecStandaloneDraftWorker,
    )

    seams.hook(seams.EAGLE_DRAFT_WORKER, NanoSpecEagleDraftWorker)
    seams.hook(seams.STANDALONE_DRAFT_WORKER, NanoSpecStandaloneDraftWorker)
    seams.hook(seams.EAGLE_SAMPLE, eagle_sample_hook)
    seams.hook(seams.OUTPUT_STREAMER, lambda scheduler: output_streamer.NanoSpecOutputStreamer)
    seams.hook(seams.SCHEDULER_IDLE, release_ended_on_idle)
    seams.hook(seams.INTERNAL_STATE_HANDLERS, live_settings.update_handlers_hook)
    seams.hook(seams.INTERNAL_STATE_GET, live_settings.get_internal_state_hook)
    from nanospec_server.sglang_plugin.spec import adaptive, draft_topk

    adaptive.register_hooks()  # depth per step, and our policy where --nanospec-adaptive

    draft_topk.register_hooks()  # the fused draft top-k (CUDA); other tensors pass through
    from nanospec_server.sglang_plugin.cpu.sampling import install_cpu_sampling_hook

    install_cpu_sampling_hook()  # CPU only: EAGLE verify samples instead of going greedy
    seams.apply()
    logger.info("nanospec: draft workers, verify capture and statistics installed")


def release_ended_on_idle(scheduler, *args, **kwargs) -> None:
    """BEFORE hook on `Scheduler.on_idle` (no batch in flight): the last requests' slots
    go back now, not when the next request's step comes, so an idle server holds none."""
    from nanospec_server.sglang_plugin.spec.step_context import current

    if (runtime := current().runtime) is not None:
        runtime.release_ended()
