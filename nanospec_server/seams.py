"""Every point where nanospec patches SGLang (and the libraries it serves with), in one list.

Read this list first on an SGLang upgrade: each seam names the symbol it patches, how, why,
and the module that installs it. Installers keep deciding which process installs what, and
when; they name their targets only through the constants here, and register and apply
hooks only through ``hook``, ``patch`` and ``apply``. ``tests/sglang_plugin/test_seams.py``
checks that every symbol exists in the pinned SGLang, that no other module names a hook
target or touches SGLang's ``HookRegistry``, and that every seam's installer uses it.

Importing this module imports no SGLang: the stand-in shim reads it before SGLang loads.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

PLUGIN = "nanospec_server.sglang_plugin"


class SeamKind(Enum):
    BEFORE = "before"  # a HookRegistry BEFORE hook
    AFTER = "after"  # a HookRegistry AFTER hook
    AROUND = "around"  # a HookRegistry AROUND hook
    REPLACE = "replace"  # a HookRegistry REPLACE (a class or function swapped for ours)
    ATTRIBUTE = "attribute"  # a module global set directly, outside the registry
    STAND_IN = "stand_in"  # a whole module SGLang imports, served by our package

    @property
    def is_hook(self) -> bool:
        return self in HOOK_KINDS


HOOK_KINDS = frozenset({SeamKind.BEFORE, SeamKind.AFTER, SeamKind.AROUND, SeamKind.REPLACE})


@dataclass(frozen=True)
class Seam:
    name: str  # the constant naming it in this module
    target: str  # dotted path of the patched symbol (a module name for a stand-in)
    kind: SeamKind
    reason: str
    installer: str  # dotted name of the module that installs it

    @property
    def attribute(self) -> str:
        """The patched symbol's own name, the last part of its dotted path."""
        return self.target.rsplit(".", 1)[-1]


_ENTRY = f"{PLUGIN}.entry"
_SCHEDULER_HOOKS = f"{PLUGIN}.scheduler_hooks"
_ADAPTIVE = f"{PLUGIN}.spec.adaptive"
_DRAFT_TOPK = f"{PLUGIN}.spec.draft_topk"
_GRAMMAR = f"{PLUGIN}.requests.grammar_conflict"
_CPU_LINEAR = f"{PLUGIN}.cpu.linear"
_CPU_PARALLEL = f"{PLUGIN}.cpu.parallel"
_CPU_SAMPLING = f"{PLUGIN}.cpu.sampling"
_NO_TOKEN_LEFT = f"{PLUGIN}.requests.no_token_left"
_SHIM = "nanospec_server.sgl_kernel_cpu.shim"

_SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
_SIGNALS = "sglang.srt.managers.tokenizer_manager.SignalHandler"
_INTERNAL_STATE = (
    "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
)
_BATCH_RESULTS = (
    "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor"
)
_EAGLE_WORKER = "sglang.srt.speculative.eagle_worker_v2.EAGLEWorkerV2"
_EAGLE_UTILS = "sglang.srt.speculative.eagle_utils"
_UNQUANT = "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod"

# The launcher (HTTP server process).
FREEZE_GC_AFTER_WARMUP = Seam(
    "FREEZE_GC_AFTER_WARMUP",
    "sglang.srt.entrypoints.http_server._freeze_gc_after_server_warmup",
    SeamKind.AROUND,
    "post /freeze_gc only once our uvicorn listens, not racing its bind",
    _ENTRY,
)
SIGQUIT_HANDLER = Seam(
    "SIGQUIT_HANDLER",
    f"{_SIGNALS}.running_phase_sigquit_handler",
    SeamKind.AROUND,
    "a dead scheduler stops `nanospec serve` with a message and exit status 1",
    _ENTRY,
)
WATCHDOG_CHECK = Seam(
    "WATCHDOG_CHECK",
    "sglang.srt.utils.watchdog.SubprocessWatchdog._check_processes",
    SeamKind.AROUND,
    "the subprocess watchdog reports a dead scheduler through engine_watch",
    _ENTRY,
)
UVICORN_EXIT = Seam(
    "UVICORN_EXIT",
    "uvicorn.server.Server.handle_exit",
    SeamKind.BEFORE,
    "Ctrl-C or SIGTERM before SGLang's loop runs is a shutdown, not a dead engine",
    _ENTRY,
)
SIGTERM_HANDLER = Seam(
    "SIGTERM_HANDLER",
    f"{_SIGNALS}.sigterm_handler",
    SeamKind.BEFORE,
    "SIGTERM is a shutdown, not a dead engine",
    _ENTRY,
)
VALIDATE_REQUEST = Seam(
    "VALIDATE_REQUEST",
    "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
    SeamKind.BEFORE,
    "refuse bad token ids, w_max and stop_regex with a 400 before the scheduler",
    _ENTRY,
)
SCHEDULER_INIT = Seam(
    "SCHEDULER_INIT",
    f"{_SCHEDULER}.__init__",
    SeamKind.BEFORE,
    "install the scheduler-only hooks once a scheduler process builds its Scheduler",
    _ENTRY,
)

# Every scheduler.
GRAMMAR_PREFILL = Seam(
    "GRAMMAR_PREFILL",
    f"{_BATCH_RESULTS}._apply_prefill_grammar",
    SeamKind.AROUND,
    "a grammar that ends before min_new_tokens is a 400, not SGLang's 500",
    _GRAMMAR,
)
GRAMMAR_ACCEPT = Seam(
    "GRAMMAR_ACCEPT",
    f"{_BATCH_RESULTS}._accept_grammar_tokens",
    SeamKind.AROUND,
    "a grammar that ends before min_new_tokens is a 400, not SGLang's 500",
    _GRAMMAR,
)

# CPU schedulers: a request whose constraints leave no token to sample ends alone.
NO_TOKEN_LEFT_RUN_BATCH = Seam(
    "NO_TOKEN_LEFT_RUN_BATCH",
    f"{_SCHEDULER}.run_batch",
    SeamKind.AROUND,
    "know the batch whose rows a sampler guard may end",
    _NO_TOKEN_LEFT,
)
NO_TOKEN_LEFT_SAMPLE = Seam(
    "NO_TOKEN_LEFT_SAMPLE",
    f"{_SCHEDULER}.launch_batch_sample_if_needed",
    SeamKind.AROUND,
    "know the batch when sampling is launched apart from the forward",
    _NO_TOKEN_LEFT,
)
NO_TOKEN_LEFT_SAMPLER = Seam(
    "NO_TOKEN_LEFT_SAMPLER",
    "sglang.srt.layers.sampler.Sampler.forward",
    SeamKind.AROUND,
    "a row with no token left would stop the scheduler in torch.multinomial",
    _NO_TOKEN_LEFT,
)
NO_TOKEN_LEFT_VERIFY = Seam(
    "NO_TOKEN_LEFT_VERIFY",
    f"{_EAGLE_UTILS}.eagle_sample",
    SeamKind.AROUND,
    "the same guard in EAGLE verify's sampling",
    _NO_TOKEN_LEFT,
)

# CPU schedulers.
MODEL_PARALLEL_GROUP = Seam(
    "MODEL_PARALLEL_GROUP",
    "sglang.srt.distributed.parallel_state.init_model_parallel_group",
    SeamKind.AROUND,
    "CPU tensor parallelism over gloo: no PyNccl or custom all-reduce",
    _CPU_PARALLEL,
)
LINEAR_AFTER_LOADING = Seam(
    "LINEAR_AFTER_LOADING",
    f"{_UNQUANT}.process_weights_after_loading",
    SeamKind.AROUND,
    "pack fp32 CPU linear weights for oneDNN once, after loading",
    _CPU_LINEAR,
)
LINEAR_APPLY = Seam(
    "LINEAR_APPLY",
    f"{_UNQUANT}.apply",
    SeamKind.AROUND,
    "fp32 CPU linear layers run on the packed weights (cheaper verify, batch-invariant rows)",
    _CPU_LINEAR,
)
LM_HEAD = Seam(
    "LM_HEAD",
    "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head",
    SeamKind.AROUND,
    "fp32 CPU LM heads run on the packed weights",
    _CPU_LINEAR,
)

# Speculative schedulers.
EAGLE_DRAFT_WORKER = Seam(
    "EAGLE_DRAFT_WORKER",
    "sglang.srt.speculative.eagle_worker_v2.EagleDraftWorker",
    SeamKind.REPLACE,
    "EAGLE drafts through NanoSpec's packed LM head",
    _SCHEDULER_HOOKS,
)
STANDALONE_DRAFT_WORKER = Seam(
    "STANDALONE_DRAFT_WORKER",
    "sglang.srt.speculative.standalone_worker_v2.StandaloneDraftWorker",
    SeamKind.REPLACE,
    "STANDALONE drafts through NanoSpec's packed LM head",
    _SCHEDULER_HOOKS,
)
EAGLE_SAMPLE = Seam(
    "EAGLE_SAMPLE",
    f"{_EAGLE_UTILS}.eagle_sample",
    SeamKind.AROUND,
    "catch the target's verify logits before SGLang's sampler edits them",
    _SCHEDULER_HOOKS,
)
OUTPUT_STREAMER = Seam(
    "OUTPUT_STREAMER",
    f"{_SCHEDULER}.get_output_streamer_class",
    SeamKind.REPLACE,
    "per-request NanoSpec statistics in every response's meta_info",
    _SCHEDULER_HOOKS,
)
SCHEDULER_IDLE = Seam(
    "SCHEDULER_IDLE",
    f"{_SCHEDULER}.on_idle",
    SeamKind.BEFORE,
    "an idle server gives the last requests' vocabulary slots back at once",
    _SCHEDULER_HOOKS,
)
INTERNAL_STATE_HANDLERS = Seam(
    "INTERNAL_STATE_HANDLERS",
    f"{_INTERNAL_STATE}._update_handlers",
    SeamKind.AROUND,
    "live NanoSpec settings through SGLang's internal-state channel",
    _SCHEDULER_HOOKS,
)
INTERNAL_STATE_GET = Seam(
    "INTERNAL_STATE_GET",
    f"{_INTERNAL_STATE}.get_internal_state",
    SeamKind.AFTER,
    "publish NanoSpec's statistics through SGLang's internal-state channel",
    _SCHEDULER_HOOKS,
)
WORKER_INIT_CUDA_GRAPHS = Seam(
    "WORKER_INIT_CUDA_GRAPHS",
    f"{_EAGLE_WORKER}.init_cuda_graphs",
    SeamKind.AFTER,
    "our depth policy enters SGLang's AdaptiveController once the graphs are built",
    _ADAPTIVE,
)
MODEL_FORWARD = Seam(
    "MODEL_FORWARD",
    "sglang.srt.model_executor.model_runner.ModelRunner.forward",
    SeamKind.AROUND,
    "with NANOSPEC_FORWARD_LOG set, log each forward's time and the time between forwards",
    f"{PLUGIN}.stats.forward_log",
)
WORKER_FORWARD = Seam(
    "WORKER_FORWARD",
    f"{_EAGLE_WORKER}.forward_batch_generation",
    SeamKind.AROUND,
    "time each speculative step and record the depth it ran at",
    _ADAPTIVE,
)
WORKER_SKIPPED_EXTEND = Seam(
    "WORKER_SKIPPED_EXTEND",
    f"{_EAGLE_WORKER}._stub_skipped_draft_extend",
    SeamKind.AFTER,
    "a depth-0 step still updates NanoSpec's windows when the draft extend is skipped",
    _ADAPTIVE,
)
RENORM_DRAFT_PROBS = Seam(
    "RENORM_DRAFT_PROBS",
    "sglang.srt.speculative.spec_utils.renorm_draft_probs",
    SeamKind.AROUND,
    "pass the fused draft top-k through, no [N, capacity] probabilities",
    _DRAFT_TOPK,
)
FAST_TOPK = Seam(
    "FAST_TOPK",
    "sglang.srt.utils.common.fast_topk",
    SeamKind.AROUND,
    "the draft loop's top-k, already fused into the packed head",
    _DRAFT_TOPK,
)
DRAFT_TOPK1_POSTPROCESS = Seam(
    "DRAFT_TOPK1_POSTPROCESS",
    "sglang.kernels.ops.speculative.topk1.draft_topk1_postprocess",
    SeamKind.AROUND,
    "the top-1 draft path, already fused into the packed head",
    _DRAFT_TOPK,
)

# Speculative CPU schedulers whose sgl_kernel is our stand-in.
VERIFY_USES_GREEDY = Seam(
    "VERIFY_USES_GREEDY",
    f"{_EAGLE_UTILS}._verify_uses_greedy",
    SeamKind.AROUND,
    "EAGLE verify samples on CPU instead of forcing greedy",
    _CPU_SAMPLING,
)
TREE_SAMPLING_OP = Seam(
    "TREE_SAMPLING_OP",
    f"{_EAGLE_UTILS}.tree_speculative_sampling_target_only",
    SeamKind.ATTRIBUTE,
    "bound to None on CPU: sampling verify calls our stand-in op instead",
    _CPU_SAMPLING,
)
TOP_K_RENORM = Seam(
    "TOP_K_RENORM",
    f"{_EAGLE_UTILS}.top_k_renorm_prob",
    SeamKind.ATTRIBUTE,
    "bound to None on CPU: sampling verify renormalises with our stand-in",
    _CPU_SAMPLING,
)
TOP_P_RENORM = Seam(
    "TOP_P_RENORM",
    f"{_EAGLE_UTILS}.top_p_renorm_prob",
    SeamKind.ATTRIBUTE,
    "bound to None on CPU: sampling verify renormalises with our stand-in",
    _CPU_SAMPLING,
)

# Every process of a CPU host without a loadable sgl_kernel.
SGL_KERNEL = Seam(
    "SGL_KERNEL",
    "sgl_kernel",
    SeamKind.STAND_IN,
    "SGLang's CPU path imports sgl_kernel; no real build loads on a CPU-only host",
    _SHIM,
)

SEAMS: tuple[Seam, ...] = tuple(v for v in globals().values() if isinstance(v, Seam))


def hook(seam: Seam, fn: Callable) -> None:
    """Register ``fn`` on a hook seam with SGLang's HookRegistry (applied by ``apply``)."""
    if not isinstance(seam, Seam) or not seam.kind.is_hook:
        raise ValueError(f"not a hook seam: {seam!r}")
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(seam.target, fn, HookType[seam.kind.name])


def apply() -> None:
    """Apply every hook registered so far (targets already patched are skipped)."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.apply_hooks()


def _owner_and_attribute(seam: Seam) -> tuple[object, str]:
    if not isinstance(seam, Seam) or seam.kind is not SeamKind.ATTRIBUTE:
        raise ValueError(f"not an attribute seam: {seam!r}")
    return importlib.import_module(seam.target.rsplit(".", 1)[0]), seam.attribute


def current(seam: Seam) -> object:
    """What an attribute seam's module global holds now (None where unset)."""
    owner, attribute = _owner_and_attribute(seam)
    return getattr(owner, attribute, None)


def patch(seam: Seam, value: object) -> None:
    """Set an attribute seam's module global to ``value``."""
    owner, attribute = _owner_and_attribute(seam)
    setattr(owner, attribute, value)
