"""Run by test_window_refresh.py under TRITON_INTERPRET=1 (and by the device check on a
GPU): the fused window refresh against WindowState's torch code, on random windows with
one W_max per slot (or one for the batch)."""

import sys

import torch

from nanospec_server import ops
from nanospec_server.ops import triton_kernels
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


def run(device: str, seeds: range) -> None:
    changes = 0
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        vocab_size = int(torch.randint(5, 300, (1,), generator=gen))
        w_cap = int(torch.randint(1, 40, (1,), generator=gen))
        fused, torch_path = (WindowState(vocab_size, w_cap, 5, torch.device(device)) for _ in "ab")
        for _ in range(6):
            slots = (
                torch.randperm(4, generator=gen)[: int(torch.randint(1, 5, (1,), generator=gen))]
                + 1
            )
            length = int(torch.randint(0, 2 * w_cap + 2, (1,), generator=gen))
            tokens = torch.randint(0, vocab_size, (len(slots), length), generator=gen)
            valid = torch.rand(len(slots), length, generator=gen) < 0.8
            # One W_max per slot (requests with their own), or one for the batch.
            w_max = torch.randint(1, w_cap + 1, (len(slots),), generator=gen).to(device)
            if seed % 3 == 0:
                w_max = int(w_max[0])
            for window in (fused, torch_path):
                window.append(slots.to(device), tokens.to(device), valid.to(device))
            state = (fused.ring, fused.length, fused.last_pos, fused.members, fused.in_set)
            rows_w_max = ops.w_max_per_row(w_max, slots.to(device))
            *got, compact = triton_kernels.window_refresh(*state, slots.to(device), rows_w_max)
            want = torch_path.refresh_reference(slots.to(device), w_max)
            check_compact(compact, want)
            expected = (want.enter_tokens, want.enter, want.leave_tokens, want.leave)
            for name, a, b in zip(
                ("enter_tokens", "enter", "leave_tokens", "leave"), got, expected, strict=True
            ):
                assert torch.equal(a.cpu(), b.cpu()), (seed, name)
            assert torch.equal(fused.members[:, :w_cap].cpu(), torch_path.members[:, :w_cap].cpu())
            assert torch.equal(
                fused.in_set[:, :vocab_size].cpu(), torch_path.in_set[:, :vocab_size].cpu()
            )
            changes += int(want.enter.sum()) * int(want.leave.sum() > 0)
    assert changes > 0  # tokens entered and left: the comparison had something to compare


if __name__ == "__main__":
    run(
        sys.argv[1] if len(sys.argv) > 1 else "cpu",
        range(int(sys.argv[2]) if len(sys.argv) > 2 else 20),
    )
    print("ok")
