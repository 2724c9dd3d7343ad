"""One command for a lent GPU host: NanoSpec's CUDA path checked, then timed.

Needs only torch, triton, pytest, hypothesis (and nvcc for the C++ kernels): no SGLang, no
network. From the repository root:

    python benchmarks/device_check.py            # everything (a few minutes)
    python benchmarks/device_check.py --quick    # fewer shapes and repetitions

1. correctness: the kernel and vocabulary tests on CUDA (their GPU-only cases run here),
   and the fixed-shape CUDA path against the torch reference on random streams;
2. CUDA graphs: one captured step (append, refresh on the side stream, packed logits,
   top-k) replayed while the live union grows and shrinks, against eager CPU results;
3. timing at Llama-3-8B and Qwen2.5-7B draft-head shapes (random bf16 weights): full head,
   packed head at live counts from benchmarks/gpu_cost_model.py, FR-Spec's 32k head, the
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

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests/vocab"), str(ROOT / "tests/ops")]

# (name, vocab size, hidden size) of draft heads: EAGLE heads share the target's LM head.
SHAPES = [("llama3-8b", 128256, 4096), ("qwen2.5-7b", 152064, 3584)]
# Live union sizes replayed by gpu_cost_model.py (batch 1 .. 32 of Spec-Bench streams).
LIVE_COUNTS = [2048, 6144, 16384]
FR_SPEC_ROWS = 32768
NO_GPU_STATUS = 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    parser.add_argument("--skip-tests", action="store_true", help="timing only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("device_check: no CUDA GPU on this machine; run it on a GPU host.")
        return NO_GPU_STATUS
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    failures = 0 if args.skip_tests else run_correctness(args.quick)
    failures += run_graph_check()
    run_timings(args.quick)
    print("device_check:", "FAILED" if failures else "all checks passed")
    return 1 if failures else 0


# -- 1. correctness ---------------------------------------------------------------------


def run_correctness(quick: bool) -> int:
    tests = ["tests/ops", "tests/vocab", "-x", "-q", "-p", "no:cacheprovider"]
    if quick:
        tests += ["-k", "not properties"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    pytest = subprocess.run([sys.executable, "-m", "pytest", *tests], cwd=ROOT, env=env)
    print(
        f"[1] kernel and vocabulary tests on CUDA: {'ok' if pytest.returncode == 0 else 'FAILED'}"
    )
    import cuda_path_check
    import window_refresh_check

    try:
        window_refresh_check.run("cuda", range(10 if quick else 40))
        print("[1] fused window refresh vs its torch reference: ok")
        cuda_path_check.run("cuda", range(4 if quick else 12))
        print("[1] fixed-shape CUDA path vs torch reference: ok")
        return int(pytest.returncode != 0)
    except AssertionError as error:
        print(f"[1] fixed-shape CUDA path vs torch reference: FAILED {error}")
        return 1


# -- 2. CUDA graph replay as the live count changes ---------------------------------------


def run_graph_check() -> int:
    from nanospec_server.vocab import DynamicVocab

    gen = torch.Generator().manual_seed(0)
    vocab_size, hidden, w = 4099, 128, 96
    weight = torch.randn(vocab_size, hidden, generator=gen)
    settings = dict(num_slots=5, w_cap=w, w_max=w, always_active=(0,), union_capacity=200)
    gpu = DynamicVocab(weight.cuda(), static_shapes=True, **settings)
    cpu = DynamicVocab(weight, static_shapes=False, **settings)
    slots = torch.tensor([1, 2, 3, 4])
    row_slots = slots.repeat_interleave(3)
    tokens = torch.zeros(4, 40, dtype=torch.int64, device="cuda")
    valid = torch.zeros(4, 40, dtype=torch.bool, device="cuda")
    hidden_rows = torch.zeros(len(row_slots), hidden, device="cuda")

    def step(vocab, device):
        vocab.append(slots.to(device), tokens.to(device), valid.to(device))
        vocab.refresh(slots.to(device))
        probs, ids = vocab.topk(hidden_rows.to(device), row_slots.to(device), 4)
        return probs, ids, vocab.head.count.clone()

    def new_inputs(i: int):
        # Narrow then wide token ranges: the union grows, overflows, and shrinks again.
        span = [30, 400, 4000, 60, 4000, 20][i % 6]
        tokens.copy_(torch.randint(1, span, tokens.shape, generator=gen))
        valid.copy_(torch.rand(valid.shape, generator=gen) < 0.9)
        hidden_rows.copy_(torch.randn(hidden_rows.shape, generator=gen))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernel builds and Triton compiles
        for i in range(3):
            new_inputs(i)
            step(gpu, "cuda")
            step(cpu, "cpu")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        probs, ids, count = step(gpu, "cuda")
    counts, failures = [], 0
    for i in range(12):
        new_inputs(i)
        graph.replay()
        want_probs, want_ids, want_count = step(cpu, "cpu")
        counts.append(int(count))
        ok = int(count) == int(want_count) and torch.allclose(
            probs.cpu(), want_probs, atol=1e-4, rtol=1e-3
        )
        live = want_probs > 1e-3
        failures += not (ok and torch.equal(ids.cpu()[live], want_ids[live]))
    varied = len(set(counts)) > 3
    print(
        f"[2] CUDA graph replay, live counts {counts}: {'ok' if not failures and varied else 'FAILED'}"
    )
    return int(bool(failures) or not varied)


# -- 3. timings ---------------------------------------------------------------------------


def time_ms(fn, repeat: int) -> float:
    """Median of ``repeat`` CUDA-graph replays of ``fn`` (launch overhead excluded)."""
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
    src = torch.empty(2**29, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), 20)
    return 2 * src.numel() / ms / 1e6  # read + write


def run_timings(quick: bool) -> None:
    from nanospec_server import ops

    repeat = 20 if quick else 100
    peak = copy_bandwidth_gbs()
    print(f"[3] timings (median of {repeat} graph replays, bf16); copy bandwidth {peak:.0f} GB/s")
    print(f"{'shape':<12}{'N':>4}  {'what':<34}{'ms':>8}{'vs full':>9}{'GB/s':>8}{'of copy':>9}")
    for name, vocab_size, hidden in SHAPES[:1] if quick else SHAPES:
        weight = torch.randn(vocab_size, hidden, device="cuda", dtype=torch.bfloat16)
        for n in (4, 32) if quick else (4, 32, 128):
            h = torch.randn(n, hidden, device="cuda", dtype=torch.bfloat16)
            rows = head_timings(ops, weight, h, repeat)
            full = rows[0][1]
            for what, ms, nbytes in rows:
                gbs = nbytes / ms / 1e6
                print(
                    f"{name:<12}{n:>4}  {what:<34}{ms:>8.3f}{full / ms:>8.1f}x{gbs:>8.0f}{gbs / peak:>8.0%}"
                )
        refresh_and_gather(name, weight, repeat, peak)
        del weight
        torch.cuda.empty_cache()


def head_timings(ops, weight: torch.Tensor, h: torch.Tensor, repeat: int) -> list:
    """(what, ms, bytes read) of the full head, FR-Spec's 32k rows, and the packed head at
    several live counts in a buffer of the largest (plus the softmax + top-k after it)."""
    vocab_size, hidden = weight.shape
    row_bytes = hidden * weight.element_size()
    fr = weight[:FR_SPEC_ROWS]
    rows = [
        ("full head", time_ms(lambda: h @ weight.T, repeat), vocab_size * row_bytes),
        ("FR-Spec 32k", time_ms(lambda: h @ fr.T, repeat), FR_SPEC_ROWS * row_bytes),
    ]
    capacity = max(LIVE_COUNTS)
    buf = weight[:capacity].clone()
    for live in LIVE_COUNTS:
        count = torch.tensor([live], device="cuda")
        ms = time_ms(lambda c=count: ops.packed_logits(h, buf, c), repeat)
        rows.append((f"packed, live {live} of {capacity}", ms, live * row_bytes))
        logits = ops.packed_logits(h, buf, count)
        ms = time_ms(lambda x=logits: torch.softmax(x, -1).topk(8, -1), repeat)
        rows.append((f"  softmax+top-k over {capacity} cols", ms, logits.numel() * 4))
    return rows


def refresh_and_gather(name: str, weight: torch.Tensor, repeat: int, peak: float) -> None:
    """One decode step's refresh at batch 32 (~25 entering tokens per request), alone and
    with its gather overlapped with a backbone-sized matmul on the compute stream."""
    from nanospec_server.vocab import DynamicVocab

    vocab_size, hidden = weight.shape
    batch, w = 32, 3072
    vocab = DynamicVocab(weight, num_slots=batch + 1, w_cap=w, w_max=w, max_batch=batch)
    slots = torch.arange(1, batch + 1, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(8):  # fill the windows
        vocab.append(slots, torch.randint(0, 20000, (batch, 512), device="cuda", generator=gen))
        vocab.refresh(slots)
    tokens = torch.randint(0, 20000, (batch, 25), device="cuda", generator=gen)

    def refresh():
        tokens.add_(7919).remainder_(20000)  # new tokens every replay, no RNG in the graph
        vocab.append(slots, tokens)
        vocab.refresh(slots)
        vocab._wait_for_refresh()

    backbone_w = torch.randn(hidden, 4 * hidden, device="cuda", dtype=weight.dtype)
    x = torch.randn(batch * 8, hidden, device="cuda", dtype=weight.dtype)

    def backbone():
        return x @ backbone_w

    def overlapped():
        tokens.add_(7919).remainder_(20000)
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
