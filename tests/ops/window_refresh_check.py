"""Run by test_window_refresh.py under TRITON_INTERPRET=1 (and by the device check on a
GPU): the Triton window append and fused refresh against WindowState's torch code, on
random streams (often few distinct tokens: many repeats, appends longer than the ring),
with one W_max per slot or one for the batch, shrinking and growing back."""

import sys

import torch
from torch import Tensor

from nanospec_server.ops import bitmap, reference, triton_kernels
from nanospec_server.ops.w_max import w_max_per_row
from nanospec_server.vocab.window import WindowState


def check_compact(compact, want) -> None:
    """The compact lists hold each row's masked tokens, in mask order."""
    enter_list, leave_list, lengths = (t.cpu() for t in compact)
    masks = (
        (want.enter_tokens, want.enter, enter_list, 0),
        (want.leave_tokens, want.leave, leave_list, 1),
    )
    for tokens, mask, listed, column in masks:
        for b in range(len(mask)):
            expected = tokens[b][mask[b]].cpu()
            assert int(lengths[b, column]) == len(expected)
            assert torch.equal(listed[b, : len(expected)], expected)


def append(window: WindowState, kernel, slots: Tensor, tokens: Tensor, valid: Tensor) -> None:
    """WindowState.append with the given window_append (Triton or the reference)."""
    offset = valid.cumsum(1) - 1
    count = valid.sum(1, keepdim=True)
    positions = window.length[slots].unsqueeze(1) + offset
    in_ring = valid & (offset >= count - window.w_cap)
    kernel(window.ring, window.latest, slots, tokens, positions, in_ring)
    window.length[slots] += count.squeeze(1)


def schedule(gen: torch.Generator, w_cap: int, step: int, slots: Tensor) -> int | Tensor:
    """W_max of a step: full, shrunk, back to full, then random per row or per batch."""
    if step < 3:
        return (w_cap, max(1, w_cap // 3), w_cap)[step]
    w_max = torch.randint(1, w_cap + 1, (len(slots),), generator=gen)
    return int(w_max[0]) if step % 2 else w_max


def run(device: str, seeds: range) -> None:
    changes = 0
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        vocab_size = int(torch.randint(5, 300, (1,), generator=gen))
        distinct = 4 if seed % 2 else vocab_size  # few distinct tokens: repeats everywhere
        w_cap = int(torch.randint(1, 40, (1,), generator=gen))
        fused, torch_path = (WindowState(vocab_size, w_cap, 5, torch.device(device)) for _ in "ab")
        for step in range(8):
            slots = (
                torch.randperm(4, generator=gen)[: int(torch.randint(1, 5, (1,), generator=gen))]
                + 1
            ).to(device)
            length = int(torch.randint(0, 2 * w_cap + 2, (1,), generator=gen))
            tokens = torch.randint(0, distinct, (len(slots), length), generator=gen).to(device)
            valid = (torch.rand(len(slots), length, generator=gen) < 0.8).to(device)
            append(fused, triton_kernels.window_append, slots, tokens, valid)
            append(torch_path, reference.window_append, slots, tokens, valid)
            assert torch.equal(fused.ring[:, :w_cap].cpu(), torch_path.ring[:, :w_cap].cpu())
            assert torch.equal(fused.latest[:, :w_cap].cpu(), torch_path.latest[:, :w_cap].cpu())
            w_max = schedule(gen, w_cap, step, slots)
            w_max = w_max.to(device) if isinstance(w_max, Tensor) else w_max
            state = (fused.ring, fused.latest, fused.length, fused.members, fused.in_set)
            rows_w_max = w_max_per_row(w_max, slots)
            *got, compact = triton_kernels.window_refresh(*state, slots, rows_w_max)
            want = torch_path.refresh_reference(slots, w_max)
            check_compact(compact, want)
            expected = (want.enter_tokens, want.enter, want.leave_tokens, want.leave)
            for name, a, b in zip(
                ("enter_tokens", "enter", "leave_tokens", "leave"), got, expected, strict=True
            ):
                assert torch.equal(a.cpu(), b.cpu()), (seed, name)
            assert torch.equal(fused.members[:, :w_cap].cpu(), torch_path.members[:, :w_cap].cpu())
            assert torch.equal(fused.in_set.cpu(), torch_path.in_set.cpu())
            check_bitmap_is_the_members(torch_path)
            changes += int(want.enter.sum()) * int(want.leave.sum() > 0)
    assert changes > 0  # tokens entered and left: the comparison had something to compare


def check_bitmap_is_the_members(window: WindowState) -> None:
    """The bitmap holds exactly the members table's tokens (and no bit past V)."""
    dense = torch.zeros(
        window.num_slots, bitmap.words_for(window.vocab_size) * 32, dtype=torch.bool
    )
    members = window.members[:, : window.w_cap].cpu().to(torch.int64)
    for slot in range(window.num_slots):
        dense[slot, members[slot][members[slot] >= 0]] = True
    assert torch.equal(bitmap.pack(dense), window.in_set.cpu())


if __name__ == "__main__":
    run(
        sys.argv[1] if len(sys.argv) > 1 else "cpu",
        range(int(sys.argv[2]) if len(sys.argv) > 2 else 20),
    )
    print("ok")
