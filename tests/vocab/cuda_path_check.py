"""Run by test_cuda_path_interpreted.py under TRITON_INTERPRET=1 (and by the device check
on a GPU): the CUDA path (fixed shapes, Triton kernels) against the torch reference path,
on random streams, per-request W_max and a live W_max that shrinks and grows back, with a
union buffer that sometimes overflows. Every third seed drafts over a pruned EAGLE-3 head
(``DraftVocab``: a d2t vocabulary D of half the tokens)."""

import sys

import torch

from nanospec_server.ops import backend
from nanospec_server.vocab import DynamicVocab
from nanospec_server.vocab.draft_vocab import DraftIds, DraftVocab


def run(device: str, seeds: range, vocab_size: int = 211, hidden: int = 32) -> None:
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        draft = None
        if seed % 3 == 0:
            draft = torch.randperm(vocab_size, generator=gen)[: vocab_size // 2].sort().values
        weight = torch.randn(vocab_size if draft is None else len(draft), hidden, generator=gen)
        w_cap = int(torch.randint(2, 24, (1,), generator=gen))
        capacity = None if seed % 2 else int(torch.randint(3, 3 * w_cap, (1,), generator=gen))
        settings = dict(num_slots=5, w_cap=w_cap, w_max=w_cap, always_active=(0, 5))
        settings["union_capacity"] = capacity
        fast = _vocab(weight.to(device), draft, vocab_size, static_shapes=True, **settings)
        backend.triton_ops.cache_clear()
        with _only_reference():
            slow = _vocab(weight, draft, vocab_size, static_shapes=False, **settings)
        for step in range(12):
            slots = (
                torch.randperm(4, generator=gen)[: int(torch.randint(1, 5, (1,), generator=gen))]
                + 1
            )
            tokens = torch.randint(0, vocab_size, (len(slots), w_cap), generator=gen)
            valid = torch.rand(len(slots), w_cap, generator=gen) < 0.8
            hidden_rows = torch.randn(2 * len(slots), hidden, generator=gen)
            if step % 4 == 1:  # requests with a W_max of their own (0: the live one)
                own = torch.randint(0, w_cap + 1, (len(slots),), generator=gen).tolist()
                fast.set_request_w_max(slots.to(device), own)
                slow.set_request_w_max(slots, own)
            if step in (6, 9):  # the live W_max shrinks, then grows back
                fast.set_w_max(max(1, w_cap // 2) if step == 6 else w_cap)
                slow.set_w_max(max(1, w_cap // 2) if step == 6 else w_cap)
            fast.append(slots.to(device), tokens.to(device), valid.to(device))
            fast.refresh(slots.to(device))
            probs, ids = fast.topk(hidden_rows.to(device), slots.repeat_interleave(2).to(device), 4)
            with _only_reference():
                slow.append(slots, tokens, valid)
                slow.refresh(slots)
                want_probs, want_ids = slow.topk(hidden_rows, slots.repeat_interleave(2), 4)
            count = int(slow.head.count)
            assert int(fast.head.count) == count <= fast.head.capacity
            assert torch.equal(fast.head.ids.cpu(), slow.head.ids)
            assert torch.equal(fast.row_token_ids.cpu(), slow.row_token_ids)
            torch.testing.assert_close(fast.head.buf[:count].cpu(), slow.head.buf[:count])
            torch.testing.assert_close(probs.cpu(), want_probs, atol=1e-4, rtol=1e-3)
            live = want_probs > 1e-3
            assert torch.equal(ids.cpu()[live], want_ids[live])
            # Fixed shapes, yet the kernel read only the live rows.
            assert fast.rows_computed == count, (fast.rows_computed, count)
            assert fast.overflow_stats() == slow.overflow_stats()
            if step % 5 == 4:
                fast.reset(slots[:1].to(device))
                with _only_reference():
                    slow.reset(slots[:1])


def _vocab(weight, draft, vocab_size: int, **settings) -> DynamicVocab:
    if draft is None:
        return DynamicVocab(weight, **settings)
    ids = DraftIds.from_hot_token_ids(draft.to(weight.device), vocab_size)
    return DraftVocab(weight, ids, **settings)


class _only_reference:
    def __enter__(self):
        import os

        self.previous = os.environ.get("NANOSPEC_OPS")
        os.environ["NANOSPEC_OPS"] = "reference"
        backend.triton_ops.cache_clear()

    def __exit__(self, *exc):
        import os

        os.environ["NANOSPEC_OPS"] = self.previous or ""
        backend.triton_ops.cache_clear()


if __name__ == "__main__":
    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    run(device, range(int(sys.argv[2]) if len(sys.argv) > 2 else 6))
    print("ok")
