"""A depth-0 step as SGLang's plain decode step.

At depth 0 SGLang's speculative worker still verifies: the last bonus token goes through
`ForwardMode.TARGET_VERIFY` (the extend attention path, metadata planned again each step),
the EAGLE sampler and the speculative bookkeeping. Here the target runs the step as a server
without speculation would: a `ForwardMode.DECODE` forward batch over the bonus tokens, one KV
slot each (the first of the slots the scheduler allocated for the step), the model runner's
own sampler (an all-greedy batch reads the argmax off the top-k pass: `argmax_from_top`).
The result is shaped as a one-token accept, so SGLang's result processing,
the draft extend (when the next step drafts) and NanoSpec's window take it as they take a
one-node verify: the window gets the step's token and the target's top-K_ver of the decode
logits, taken before the sampler edits them.

A batch that holds a request the plain path does not serve as the verify path does
(`verify_reason`) runs the whole step through the verify path.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)
from sglang.srt.runtime_context import get_parallel
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.utils.async_probe import sanitize_nan_logits

from nanospec_server import ops
from nanospec_server.sglang_plugin.spec.verify_capture import LAST_VERIFY, VerifyCandidates

# The ScheduleBatch fields the plain forward changes; put back before the draft side runs.
_CHANGED = ("input_ids", "out_cache_loc", "forward_mode", "seq_lens", "seq_lens_cpu",
            "seq_lens_sum", "orig_seq_lens", "spec_info", "return_logprob")  # fmt: skip


def serves(worker) -> bool:
    """Whether this worker's depth-0 steps may take the plain path: on a CPU, with one
    pipeline stage and one tensor-parallel rank. On CUDA the target's graphs are captured for
    the verify shape and the plain path has not been measured there; with tensor parallelism
    it has not been tested. Those servers keep SGLang's depth-0 step."""
    parallel = get_parallel()
    on_cpu = str(worker.device).startswith("cpu")
    return on_cpu and parallel.pp_size == 1 and parallel.tp_size == 1


def verify_reason(batch) -> str | None:
    """Why this batch must run its depth-0 step through the verify path, or None.

    The plain path serves greedy and sampled requests and token log-probabilities; these
    need what only the verify path does in a speculative server: a grammar's vocabulary
    mask, top-k or chosen-token log-probabilities, penalties (accumulated for the verify
    sampler), hidden states returned per token, custom logit processors, logit bias,
    sampling masks and watermarks."""
    info = batch.sampling_info
    if batch.has_grammar:
        return "grammar"
    if batch.return_logprob and any(n > 0 for n in batch.top_logprobs_nums or ()):
        return "top-k log-probabilities"
    if batch.return_logprob and any(ids is not None for ids in batch.token_ids_logprobs or ()):
        return "token-id log-probabilities"
    if info.acc_additive_penalties is not None or info.acc_scaling_penalties is not None:
        return "penalties"
    if info.penalizer_orchestrator is not None and info.penalizer_orchestrator.is_required:
        return "penalties"
    if batch.return_hidden_states:
        return "hidden states"
    if info.has_custom_logit_processor:
        return "custom logit processor"
    if info.logit_bias is not None:
        return "logit bias"
    if info.return_sampling_masks and any(info.return_sampling_masks):
        return "sampling mask"
    if info.has_watermark_candidates:
        return "watermark"
    return None


def run(worker, batch, k_ver: int) -> tuple[GenerationBatchResult, bool]:
    """The step, on the target, as plain decoding runs it; ``k_ver`` target candidates per
    request go to NanoSpec's window (0: none). Also says whether its tokens were read from
    the top-k pass (`argmax_from_top`) rather than sampled."""
    runner = worker.target_worker.model_runner
    size = batch.seq_lens.shape[0]
    saved = {name: getattr(batch, name) for name in _CHANGED}
    seq_lens = batch.seq_lens
    bonus = batch.spec_info.bonus_tokens
    rows = batch.req_pool_indices.to(torch.int64)
    slots = worker.req_to_token_pool.req_to_token[rows, seq_lens.to(torch.int64)]
    capture = _capture_mode(runner)
    try:
        batch.input_ids = bonus
        batch.out_cache_loc = slots.to(torch.int64)
        batch.forward_mode = ForwardMode.DECODE
        batch.seq_lens = seq_lens + 1  # a decode batch counts the token it feeds
        if batch.seq_lens_cpu is not None:
            batch.seq_lens_cpu = batch.seq_lens_cpu + 1
            batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
        else:
            batch.seq_lens_sum = None
        if batch.orig_seq_lens is not None:
            batch.orig_seq_lens = batch.orig_seq_lens + 1
        batch.spec_info = None
        batch.return_logprob = False  # the speculative layout is filled below
        forward_batch = ForwardBatch.init_new(
            batch, runner, capture_hidden_mode=capture, return_hidden_states_before_norm=False
        )
        output = worker.target_worker.forward_batch_generation(
            batch=None,
            forward_batch=forward_batch,
            is_verify=True,  # samples below
        )
        logits_output = output.logits_output
        logits = logits_output.next_token_logits
        raw = logits.clone() if saved["return_logprob"] else None  # the sampler scales in place
        greedy = takes_argmax(runner, forward_batch)
        if greedy:
            top, next_ids = argmax_from_top(logits, max(k_ver, 1))
        else:
            top = ops.topk_indices(logits, k_ver) if k_ver > 0 else None
            next_ids = None
        from_top = next_ids is not None
        if not from_top:
            next_ids = runner.sample(logits_output, forward_batch)
        next_ids = next_ids.to(torch.int32)
        if k_ver == 0:
            top = None  # taken for the argmax only: the window gets no candidates
    finally:
        for name, value in saved.items():
            setattr(batch, name, value)
    # What the draft extend reads, as a one-node verify leaves it.
    batch.input_ids = bonus
    batch.out_cache_loc = slots.to(torch.int64)
    accept_index = torch.arange(size, dtype=torch.int32, device=next_ids.device).unsqueeze(1)
    if raw is not None:
        logits_output.next_token_logits = raw
        compute_spec_logprobs(batch, logits_output, next_ids, accept_index=accept_index)
    LAST_VERIFY.last = _candidates(bonus, top, size)
    return GenerationBatchResult(
        logits_output=logits_output,
        next_token_ids=next_ids,
        can_run_cuda_graph=output.can_run_cuda_graph,
        speculative_num_draft_tokens=1,
        next_draft_input=EagleDraftInput(bonus_tokens=next_ids),
        accept_lens=torch.ones(size, dtype=torch.int32, device=next_ids.device),
        accept_index=accept_index,
        new_seq_lens=seq_lens + 1,
    ), from_top


def takes_argmax(runner, forward_batch) -> bool:
    """Whether SGLang's sampler would take each row's argmax of the logits as they are: every
    request greedy, and nothing that edits logits or watches the sampler. Grammar, penalties,
    logit bias, custom logit processors and watermarks already sent the batch to the verify
    path (`verify_reason`, checked before a plain step runs); an active sampling observer or
    n-gram embedding keeps the sampler."""
    info = forward_batch.sampling_info
    if not info.is_all_greedy:
        return False
    observer = runner.sampling_observer
    if observer is not None and observer.is_active(info):
        return False
    return getattr(forward_batch, "ngram_embedding_info", None) is None


def argmax_from_top(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each row's top-``k`` and its argmax, read from the top-k (first column): the top-k
    pass the window needs anyway is one read of the logits, where torch's argmax is another
    (3.3 ms against 0.8 ms for both at batch 32, 152k vocabulary, on 2 cores), and the same
    pass tells rows with nothing to pick (a NaN, all -inf) where `unsamplable_rows` would
    read them again. Both take the lowest index among equal maxima. SGLang's NaN clean-up
    runs first, as in its sampler; with a row that has nothing to pick the argmax is None:
    the sampler's guard then ends its request (`no_token_left.py`)."""
    sanitize_nan_logits(logits, "plain step: next_token_logits")
    top, empty = ops.topk_and_empty_rows(logits, k)
    return top, None if bool(empty.any()) else top[:, 0]


def _capture_mode(runner) -> CaptureHiddenMode:
    """EAGLE drafts read the target's hidden state at each position; STANDALONE none."""
    if runner.spec_algorithm.is_standalone():
        return CaptureHiddenMode.NULL
    return CaptureHiddenMode.FULL


def _candidates(bonus: torch.Tensor, top: torch.Tensor | None, size: int) -> VerifyCandidates:
    tree = bonus.view(size, 1)
    if top is None:
        empty = torch.empty(size, 0, 0, dtype=torch.int64, device=bonus.device)
        return VerifyCandidates(tree, empty, empty.bool())
    rows = top.view(size, 1, -1)
    return VerifyCandidates(tree, rows, torch.ones_like(rows, dtype=torch.bool))
