"""Run by test_union_apply.py under TRITON_INTERPRET=1 (and by the device check on a GPU):
the fused union bookkeeping (one Triton kernel + the row copies) against
UnionHead.apply_reference, on random multi-request streams whose union often exceeds a
small capacity: the same rows, ids, counts and refusals, step after step."""

import sys

import torch

from nanospec_server.vocab.union_head import UnionHead
from nanospec_server.vocab.window import WindowState


def run(device: str, seeds: range) -> None:
    refused = moved = 0
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        vocab_size = int(torch.randint(8, 200, (1,), generator=gen))
        w_cap = int(torch.randint(1, 24, (1,), generator=gen))
        hidden = 8
        weight = torch.randn(vocab_size, hidden, generator=gen).to(device)
        pinned = sorted(set(torch.randint(0, vocab_size, (2,), generator=gen).tolist()))
        capacity = int(
            torch.randint(len(pinned), min(vocab_size, 3 * w_cap + 2) + 1, (1,), generator=gen)
        )
        dev = torch.device(device)
        windows = [WindowState(vocab_size, w_cap, 6, dev) for _ in "ab"]
        heads = [UnionHead(weight, capacity, pinned, dev) for _ in "ab"]
        row_ids = [h.ids.clamp(min=0) for h in heads]
        for _ in range(10):
            slots = (
                torch.randperm(5, generator=gen)[: int(torch.randint(1, 6, (1,), generator=gen))]
                + 1
            )
            length = int(torch.randint(0, 2 * w_cap + 2, (1,), generator=gen))
            # A narrow token range makes requests share tokens (duplicates across slots).
            high = int(torch.randint(2, vocab_size + 1, (1,), generator=gen))
            tokens = torch.randint(0, high, (len(slots), length), generator=gen)
            valid = torch.rand(len(slots), length, generator=gen) < 0.8
            w_max = int(torch.randint(1, w_cap + 1, (1,), generator=gen))
            slots, tokens, valid = slots.to(dev), tokens.to(dev), valid.to(dev)
            for window in windows:
                window.append(slots, tokens, valid)
            fused_diff = windows[0].refresh(slots, w_max)
            assert fused_diff.compact is not None  # the Triton window refresh ran
            old_count = int(heads[1].count)
            heads[0].apply(fused_diff, row_ids[0])
            heads[1].apply_reference(windows[1].refresh_reference(slots, w_max))
            torch.clamp(heads[1].ids, min=0, out=row_ids[1])
            fused, reference = heads
            for name in ("ids", "row_of", "ref", "count", "dropped", "overflows"):
                assert torch.equal(getattr(fused, name).cpu(), getattr(reference, name).cpu()), (
                    seed,
                    name,
                )
            count = int(reference.count)
            assert torch.equal(fused.buf[:count].cpu(), reference.buf[:count].cpu()), seed
            assert torch.equal(row_ids[0].cpu(), row_ids[1].cpu()), seed
            assert (fused.owner.cpu() == 2**62).all()
            moved += int(count < old_count)
        refused += int(heads[1].dropped)
    assert refused > 0 and moved > 0  # overflow and shrinking both happened


if __name__ == "__main__":
    run(
        sys.argv[1] if len(sys.argv) > 1 else "cpu",
        range(int(sys.argv[2]) if len(sys.argv) > 2 else 30),
    )
    print("ok")
