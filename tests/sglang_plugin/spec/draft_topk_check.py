"""Run by test_draft_topk.py under TRITON_INTERPRET=1: SGLang's own draft top-k functions
(`renorm_draft_probs` + `fast_topk`, `draft_topk1_postprocess`) fed the fused path's
carrier through our hooks give the same tokens and probabilities as the same functions
fed the full-width masked logits of the packed head (the unfused path)."""

import sys

import torch
from sglang.kernels.ops.speculative.topk1 import draft_topk1_postprocess
from sglang.srt.speculative.spec_utils import renorm_draft_probs
from sglang.srt.utils.common import fast_topk

from nanospec_server.sglang_plugin.spec import draft_topk
from nanospec_server.sglang_plugin.spec.packed_head import (
    PackedLogitsMethod,
    PackedTopkMethod,
    PackedWeight,
)
from nanospec_server.vocab import DynamicVocab


def run(seeds: range) -> None:
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        vocab_size, hidden_size, batch = 120, 24, 3
        weight = torch.randn(vocab_size, hidden_size, generator=gen)
        vocab = DynamicVocab(
            weight, num_slots=4, w_cap=16, w_max=16, always_active=(7,), static_shapes=True
        )
        assert vocab.fuses_topk
        slots = torch.arange(1, batch + 1)
        for _ in range(2):
            vocab.append(slots, torch.randint(0, vocab_size, (batch, 12), generator=gen))
            vocab.refresh(slots)
        assert int(vocab.head.count) < vocab.head.capacity  # fixed shape wider than live
        for k in (1, 2, 4):
            rows_per_request = k
            hidden = torch.randn(batch * rows_per_request, hidden_size, generator=gen)
            row_slots = slots.repeat_interleave(rows_per_request)
            rows, _ = vocab.packed_rows(min_rows=k)

            logits = PackedLogitsMethod(vocab).apply(PackedWeight(rows, None), hidden)
            vocab.mask_logits_(logits, row_slots)
            method = PackedTopkMethod(vocab, slots, k)
            carrier = method.apply(PackedWeight(rows, method), hidden)
            assert carrier.shape == (len(hidden), 2 * k)  # no [N, capacity] tensor

            if k == 1:
                want_positions = torch.arange(len(hidden))
                got_positions = want_positions.clone()
                want_p, want_rows = draft_topk1_postprocess(logits, want_positions)
                got_p, got_rows = draft_topk.draft_topk1_postprocess_hook(
                    draft_topk1_postprocess, carrier, got_positions, None, 0
                )
                assert torch.equal(got_positions, want_positions)
            else:
                want_p, want_rows = fast_topk(renorm_draft_probs(logits, None, False), k, dim=-1)
                probs = draft_topk.renorm_draft_probs_hook(renorm_draft_probs, carrier, None, False)
                got_p, got_rows = draft_topk.fast_topk_hook(fast_topk, probs, k, dim=-1)
            torch.testing.assert_close(got_p, want_p, atol=1e-5, rtol=1e-4)
            ids = vocab.row_token_ids
            live = want_p > 1e-6
            assert torch.equal(ids[got_rows][live], ids[want_rows][live]), (seed, k)
            # Anything else passes through to SGLang's function.
            assert torch.equal(
                draft_topk.renorm_draft_probs_hook(renorm_draft_probs, logits, None, False),
                renorm_draft_probs(logits, None, False),
            )


if __name__ == "__main__":
    run(range(int(sys.argv[1]) if len(sys.argv) > 1 else 4))
    print("ok")
