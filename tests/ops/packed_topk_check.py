"""Run by test_packed_topk.py under TRITON_INTERPRET=1 (and by the device check on a GPU):
the fused packed-head top-k kernel against ``reference.packed_topk`` on random inputs.

Weights and hidden rows hold small integers, so every dot product is exact in float32 on
both sides and ties are frequent: the tie rule (lowest packed row first) is tested, not
left to rounding. Rows at or past the live count hold NaN: a kernel that let them in
would fail."""

import sys

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanospec_server.ops import bitmap, reference, triton_kernels


@st.composite
def scenarios(draw):
    capacity = draw(st.integers(1, 150))
    count = draw(st.integers(0, capacity))
    return dict(
        seed=draw(st.integers(0, 2**31 - 1)),
        vocab_size=draw(st.integers(capacity, 2 * capacity + 5)),
        capacity=capacity,
        count=count,
        num_pinned=draw(st.integers(0, min(count, 3))),
        n_rows=draw(st.integers(0, 9)),
        hidden=draw(st.integers(1, 40)),
        k=draw(st.integers(1, 6)),
        splits=draw(st.sampled_from([1, 2, 4, 64])),
        spread=draw(st.sampled_from([1, 3])),  # 1: ties everywhere
        bf16=draw(st.booleans()),  # used on CUDA only (see check)
    )


def check(case: dict, device: str) -> None:
    gen = torch.Generator().manual_seed(case["seed"])
    vocab_size, capacity, count = case["vocab_size"], case["capacity"], case["count"]
    n_rows, num_slots, spread = case["n_rows"], 4, case["spread"]
    # Triton 3.8's interpreter computes bf16 tl.dot wrongly (garbage magnitudes, for the
    # packed-logits kernel too): bf16 is checked on a GPU only.
    dtype = torch.bfloat16 if case["bf16"] and device == "cuda" else torch.float32
    # As DynamicVocab hands them over: the buffer without its dump row, ids with it.
    rows = torch.randint(-spread, spread + 1, (capacity, case["hidden"]), generator=gen)
    rows = rows.to(dtype)
    rows[count:] = float("nan")  # never to be read
    ids = torch.full((capacity + 1,), -1, dtype=torch.int64)
    ids[:count] = torch.randperm(vocab_size, generator=gen)[:count]
    ids[:count][torch.rand(count, generator=gen) < 0.1] = -1  # a few free rows below count
    in_set = bitmap.pack(torch.rand(num_slots, vocab_size, generator=gen) < 0.5)
    row_slots = torch.randint(0, num_slots, (n_rows,), generator=gen)
    hidden = torch.randint(-spread, spread + 1, (n_rows, case["hidden"]), generator=gen).float()
    args = (torch.tensor([count]), ids, in_set, row_slots, case["num_pinned"], case["k"])
    want_v, want_r, want_lse = reference.packed_topk(hidden, rows, *args)
    on = [t.to(device) if isinstance(t, torch.Tensor) else t for t in (hidden, rows, *args)]
    got_v, got_r, got_lse = (
        t.cpu() for t in triton_kernels.packed_topk(*on, splits=case["splits"])
    )
    finite = torch.isfinite(want_v)
    assert torch.equal(torch.isfinite(got_v), finite), case
    assert torch.equal(got_v[finite], want_v[finite]), case
    assert torch.equal(got_r[finite], want_r[finite]), case  # same rows, same tie rule
    assert ((got_r >= 0) & (got_r < capacity)).all(), case  # fillers: valid rows
    torch.testing.assert_close(got_lse, want_lse, rtol=1e-5, atol=1e-5)


def run(device: str, examples: int) -> None:
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(scenarios())
    def property_holds(case):
        check(case, device)

    property_holds()


if __name__ == "__main__":
    run(sys.argv[1] if len(sys.argv) > 1 else "cpu", int(sys.argv[2]) if len(sys.argv) > 2 else 60)
    print("ok")
