"""The draft LM head takes SGLang's quant_method seam into DynamicVocab.packed_logits."""

import torch
from sglang.srt.layers.logits_processor import should_apply_lm_head_quant_method

from nanospec_server.sglang_plugin.spec.packed_head import PackedLogitsMethod, PackedWeight
from nanospec_server.vocab import DynamicVocab


def test_sglang_routes_the_packed_head_through_our_method():
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(97, 16, generator=gen)
    vocab = DynamicVocab(weight, num_slots=3, w_cap=8, w_max=8, static_shapes=True)
    vocab.append(torch.tensor([1, 2]), torch.tensor([[4, 5, 6], [6, 7, 8]]))
    vocab.refresh(torch.tensor([1, 2]))
    rows, ids = vocab.packed_rows(min_rows=2)
    method = PackedLogitsMethod(vocab)
    head = PackedWeight(rows, method)
    assert should_apply_lm_head_quant_method(head, method)  # SGLang's own dispatch

    hidden = torch.randn(4, 16, generator=gen)
    logits = method.apply(head, hidden)
    assert logits.shape == (4, rows.shape[0]) and logits.dtype == torch.float32
    live = int(vocab.head.count)
    assert live == 5 < rows.shape[0]  # fixed shape: the whole capacity
    torch.testing.assert_close(logits[:, :live], hidden @ weight[ids[:live]].T)
    assert torch.isinf(logits[:, live:]).all()
