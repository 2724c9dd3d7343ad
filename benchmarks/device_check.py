"""One command for a lent GPU host: NanoSpec's CUDA path checked, then timed.

Needs only torch, triton, pytest, hypothesis (and nvcc for the C++ kernels): no SGLang, no
network. From the repository root:

    python benchmarks/device_check.py            # everything (a few minutes)
    python benchmarks/device_check.py --quick    # fewer shapes and repetitions
    python benchmarks/device_check.py --dry-run  # no GPU: tiny shapes, Triton interpreter

``--dry-run`` runs every part on the CPU (Triton's interpreter, graphs replaced by eager
re-runs, wall-clock timings) so the script is exercised by the test suite and cannot rot;
its numbers mean nothing.

1. correctness: the kernel and vocabulary tests on CUDA (their GPU-only cases run here),
   and the fixed-shape CUDA path against the torch reference on random streams;
2. CUDA graphs: one captured step (append, fused refresh on the side stream, fused packed
   head + top-k) replayed while the live union grows, overflows and shrinks, against the
   eager torch reference path on the CPU;
3. timing at Llama-3-8B and Qwen2.5-7B draft-head shapes (random bf16 weights): full head,
   packed head at live counts from benchmarks/gpu_cost_model.py (logits + SGLang-style
   softmax/top-k over the capacity, against the fused top-k), FR-Spec's 32k head, the
   refresh, and the gather overlapped with a backbone-sized matmul. One table, with ratios
   against the full head and bandwidth against a measured device-to-device copy.

On a machine without a CUDA GPU it says so and exits with status 2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

if "--dry-run" in sys.argv:  # before triton is imported: it reads this at import time
    os.environ["TRITON_INTERPRET"] = "1"
    os.environ["NANOSPEC_OPS"] = "triton"  # the CUDA path's kernels, not the CPU C++ loops

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests/vocab"), str(ROOT / "tests/ops")]

# (name, vocab size, hidden size) of draft heads: EAGLE heads share the target's LM head.
SHAPES = [("llama3-8b", 128256, 4096), ("qwen2.5-7b", 152064, 3584)]
# Live union sizes replayed by gpu_cost_model.py (batch 1 .. 32 of Spec-Bench streams).
LIVE_COUNTS = [2048, 6144, 16384]
FR_SPEC_ROWS = 32768
NO_GPU_STATUS = 2
DEVICE = "cuda"
# --dry-run: the same code paths at sizes the Triton interpreter gets through in seconds.
DRY_SHAPES = [("tiny", 300, 32)]
DRY_LIVE_COUNTS = [16, 48, 100]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    parser.add_argument("--skip-tests", action="store_true", help="timing only")
    parser.add_argument(
        "--dry-run", action="store_true", help="CPU, tiny shapes, Triton interpreter"
    )
    args = parser.parse_args()
    if args.dry_run:
        global DEVICE, SHAPES, LIVE_COUNTS, FR_SPEC_ROWS
        DEVICE, SHAPES, LIVE_COUNTS, FR_SPEC_ROWS = "cpu", DRY_SHAPES, DRY_LIVE_COUNTS, 64
        args.quick = True
        print(f"device: CPU (dry run, Triton interpreter), torch {torch.__version__}")
    elif not torch.cuda.is_available():
        print("device_check: no CUDA GPU on this machine; run it on a GPU host.")
        return NO_GPU_STATUS
    else:
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    failures = 0 if args.skip_tests else run_correctness(args.quick, args.dry_run)
    failures += run_graph_check()
    run_timings(args.quick)
    print("device_check:", "FAILED" if failures else "all checks passed")
    return 1 if failures else 0


# -- 1. correctness ---------------------------------------------------------------------


def run_correctness(quick: bool, dry_run: bool = False) -> int:
    failed = 0
    if not dry_run:  # the suite runs these itself on CPU
        tests = ["tests/ops", "tests/vocab", "-x", "-q", "-p", "no:cacheprovider"]
        if quick:
            tests += ["-k", "not properties"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        pytest = subprocess.run([sys.executable, "-m", "pytest", *tests], cwd=ROOT, env=env)
        failed = int(pytest.returncode != 0)
        print(f"[1] kernel and vocabulary tests on CUDA: {'FAILED' if failed else 'ok'}")
    import cuda_path_check
    import packed_topk_check
    import union_apply_check
    import window_refresh_check

    checks = [
        ("window append + fused refresh vs torch reference", window_refresh_check.run, 10, 40),
        ("fused union bookkeeping vs its torch reference", union_apply_check.run, 4, 30),
        ("fused packed head + top-k vs its torch reference", packed_topk_check.run, 10, 200),
        ("fixed-shape CUDA path vs torch reference", cuda_path_check.run, 2, 12),
    ]
    for what, check, few, many in checks:
        count = 2 if dry_run else few if quick else many
        try:
            check(DEVICE, range(count) if check is not packed_topk_check.run else count)
            print(f"[1] {what}: ok")
        except AssertionError as error:
            print(f"[1] {what}: FAILED {error}")
            failed += 1
    return failed


# -- 2. CUDA graph replay as the live count changes ---------------------------------------


def run_graph_check() -> int:
    from nanospec_server.vocab import DynamicVocab

    gen = torch.Generator().manual_seed(0)
    vocab_size, hidden, w = (4099, 128, 96) if DEVICE == "cuda" else (300, 16, 12)
    capacity = 200 if DEVICE == "cuda" else 40
    weight = torch.randn(vocab_size, hidden, generator=gen)
    settings = dict(num_slots=5, w_cap=w, w_max=w, always_active=(0,), union_capacity=capacity)
    fast = DynamicVocab(weight.to(DEVICE), static_shapes=True, **settings)
    with reference_ops():
        slow = DynamicVocab(weight, static_shapes=False, **settings)
    slots = torch.tensor([1, 2, 3, 4])
    row_slots = slots.repeat_interleave(3)
    tokens = torch.zeros(4, 40 if DEVICE == "cuda" else 8, dtype=torch.int64, device=DEVICE)
    valid = torch.zeros(tokens.shape, dtype=torch.bool, device=DEVICE)
    hidden_rows = torch.zeros(len(row_slots), hidden, device=DEVICE)

    def step(vocab, device):
        vocab.append(slots.to(device), tokens.to(device), valid.to(device))
        vocab.refresh(slots.to(device))
        probs, ids = vocab.topk(hidden_rows.to(device), row_slots.to(device), 4)
        return probs, ids, vocab.head.count.clone()

    def new_inputs(i: int):
        # Narrow then wide token ranges: the union grows, overflows, and shrinks again.
        span = [30, 400, 4000, 60, 4000, 20][i % 6]
        tokens.copy_(torch.randint(1, min(span, vocab_size), tokens.shape, generator=gen))
        valid.copy_(torch.rand(valid.shape, generator=gen) < 0.9)
        hidden_rows.copy_(torch.randn(hidden_rows.shape, generator=gen))

    def slow_step():
        with reference_ops():
            return step(slow, "cpu")

    for i in range(3):  # warm-up: kernel builds and Triton compiles
        new_inputs(i)
        capture(lambda: step(fast, DEVICE), warm_up_only=True)
        slow_step()
    outputs, replay = capture(lambda: step(fast, DEVICE))
    probs, ids, count = outputs
    counts, failures = [], 0
    for i in range(12 if DEVICE == "cuda" else 6):
        new_inputs(i)
        replay()
        want_probs, want_ids, want_count = slow_step()
        counts.append(int(count))
        ok = int(count) == int(want_count) and torch.allclose(
            probs.cpu(), want_probs, atol=1e-4, rtol=1e-3
        )
        live = want_probs > 1e-3
        failures += not (ok and torch.equal(ids.cpu()[live], want_ids[live]))
    varied = len(set(counts)) > 3
    what = "CUDA graph replay" if DEVICE == "cuda" else "eager re-run (dry run)"
    verdict = "ok" if not failures and varied else "FAILED"
    print(f"[2] {what}, live counts {counts}: {verdict}")
    return int(bool(failures) or not varied)


def capture(fn, warm_up_only: bool = False):
    """On CUDA: run ``fn`` once on a side stream (warm-up), or capture it into a graph and
    return (its outputs, replay). In a dry run, "replay" re-runs ``fn`` eagerly and copies
    the results into the first outputs, which is what a replay does to them."""
    if DEVICE != "cuda":
        outputs = fn()
        if warm_up_only:
            return outputs

        def rerun():
            for mine, fresh in zip(outputs, fn(), strict=True):
                mine.copy_(fresh)

        return outputs, rerun
    if warm_up_only:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            outputs = fn()
        torch.cuda.current_stream().wait_stream(side)
        return outputs
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = fn()
    return outputs, graph.replay


class reference_ops:
    """Inside: only the torch reference ops (the CPU side of a comparison)."""

    def __enter__(self):
        from nanospec_server.ops import backend

        self.previous = os.environ.get("NANOSPEC_OPS")
        os.environ["NANOSPEC_OPS"] = "reference"
        backend.triton_ops.cache_clear()

    def __exit__(self, *exc):
        from nanospec_server.ops import backend

        os.environ.pop("NANOSPEC_OPS")
        if self.previous is not None:
            os.environ["NANOSPEC_OPS"] = self.previous
        backend.triton_ops.cache_clear()


# -- 3. timings ---------------------------------------------------------------------------


def time_ms(fn, repeat: int) -> float:
    """Median of ``repeat`` CUDA-graph replays of ``fn`` (launch overhead excluded); in a
    dry run, of eager calls (wall clock)."""
    if DEVICE != "cuda":
        import time

        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth_gbs() -> float:
    src = torch.empty(2**29 if DEVICE == "cuda" else 2**20, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), 20)
    return 2 * src.numel() / ms / 1e6  # read + write


def run_timings(quick: bool) -> None:
    from nanospec_server import ops

    repeat = 2 if DEVICE != "cuda" else 20 if quick else 100
    peak = copy_bandwidth_gbs()
    how = "graph replays, bf16" if DEVICE == "cuda" else "eager calls, float32: meaningless"
    print(f"[3] timings (median of {repeat} {how}); copy bandwidth {peak:.0f} GB/s")
    print(f"{'shape':<12}{'N':>4}  {'what':<34}{'ms':>8}{'vs full':>9}{'GB/s':>8}{'of copy':>9}")
    for name, vocab_size, hidden in SHAPES[:1] if quick else SHAPES:
        # bf16 on a GPU; float32 in a dry run (the interpreter's bf16 tl.dot is wrong).
        dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
        weight = torch.randn(vocab_size, hidden, device=DEVICE, dtype=dtype)
        for n in (4, 32) if quick else (4, 32, 128):
            h = torch.randn(n, hidden, device=DEVICE, dtype=dtype)
            rows = head_timings(ops, weight, h, repeat)
            full = rows[0][1]
            for what, ms, nbytes in rows:
                gbs = nbytes / ms / 1e6
                print(
                    f"{name:<12}{n:>4}  {what:<34}{ms:>8.3f}{full / ms:>8.1f}x{gbs:>8.0f}{gbs / peak:>8.0%}"
                )
        refresh_and_gather(name, weight, repeat, peak)
        del weight
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


def head_timings(ops, weight: torch.Tensor, h: torch.Tensor, repeat: int) -> list:
    """(what, ms, bytes read) of the full head, FR-Spec's 32k rows, and the packed head at
    several live counts in a buffer of the largest: its logits plus the softmax + top-k
    SGLang runs over every column, against the fused head + top-k (k = 8, all rows
    active: the same work a request mask leaves, since masking costs one byte per row)."""
    from nanospec_server.ops import bitmap

    vocab_size, hidden = weight.shape
    row_bytes = hidden * weight.element_size()
    fr = weight[:FR_SPEC_ROWS]
    rows = [
        ("full head", time_ms(lambda: h @ weight.T, repeat), vocab_size * row_bytes),
        ("FR-Spec 32k", time_ms(lambda: h @ fr.T, repeat), FR_SPEC_ROWS * row_bytes),
    ]
    capacity = max(LIVE_COUNTS)
    buf = weight[:capacity].clone()
    ids = torch.arange(capacity + 1, device=h.device)
    in_set = bitmap.pack(torch.ones(1, vocab_size, dtype=torch.bool, device=h.device))
    row_slots = torch.zeros(len(h), dtype=torch.int64, device=h.device)
    for live in LIVE_COUNTS:
        count = torch.tensor([live], device=h.device)
        ms = time_ms(lambda c=count: ops.packed_logits(h, buf, c), repeat)
        rows.append((f"packed, live {live} of {capacity}", ms, live * row_bytes))
        logits = ops.packed_logits(h, buf, count)
        ms = time_ms(lambda x=logits: torch.softmax(x, -1).topk(8, -1), repeat)
        rows.append((f"  softmax+top-k over {capacity} cols", ms, logits.numel() * 4))
        fused = (h, buf, count, ids, in_set, row_slots, 0, 8)
        ms = time_ms(lambda a=fused: ops.packed_topk(*a), repeat)
        rows.append((f"  fused head+top-k, live {live}", ms, live * row_bytes))
    return rows


def refresh_and_gather(name: str, weight: torch.Tensor, repeat: int, peak: float) -> None:
    """One decode step's refresh at batch 32 (~25 entering tokens per request), alone and
    with its gather overlapped with a backbone-sized matmul on the compute stream."""
    from nanospec_server.vocab import DynamicVocab

    vocab_size, hidden = weight.shape
    batch, w, fill, span = (32, 3072, 512, 20000) if DEVICE == "cuda" else (4, 16, 8, 200)
    vocab = DynamicVocab(
        weight, num_slots=batch + 1, w_cap=w, w_max=w, max_batch=batch, static_shapes=True
    )
    slots = torch.arange(1, batch + 1, device=DEVICE)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    for _ in range(8):  # fill the windows
        vocab.append(slots, torch.randint(0, span, (batch, fill), device=DEVICE, generator=gen))
        vocab.refresh(slots)
    tokens = torch.randint(0, span, (batch, 25), device=DEVICE, generator=gen)

    def refresh():
        tokens.add_(7919).remainder_(span)  # new tokens every replay, no RNG in the graph
        vocab.append(slots, tokens)
        vocab.refresh(slots)
        vocab._wait_for_refresh()

    backbone_w = torch.randn(hidden, 4 * hidden, device=DEVICE, dtype=weight.dtype)
    x = torch.randn(batch * 8, hidden, device=DEVICE, dtype=weight.dtype)

    def backbone():
        return x @ backbone_w

    def overlapped():
        tokens.add_(7919).remainder_(span)
        vocab.append(slots, tokens)
        vocab.refresh(slots)  # side stream
        backbone()
        vocab._wait_for_refresh()

    alone = time_ms(refresh, repeat)
    compute = time_ms(backbone, repeat)
    both = time_ms(overlapped, repeat)
    print(f"{name:<12}{batch:>4}  {'refresh (append+diff+gather)':<34}{alone:>8.3f}")
    print(f"{name:<12}{batch:>4}  {'backbone-sized matmul alone':<34}{compute:>8.3f}")
    print(f"{name:<12}{batch:>4}  {'refresh overlapped with it':<34}{both:>8.3f}"
          f"   hidden: {max(0.0, 1 - (both - compute) / alone):.0%} of the refresh")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
