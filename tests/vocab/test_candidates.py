import torch

from nanospec_server.vocab import topk_tokens_in_chunks


def test_chunked_topk_equals_the_full_product():
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(50, 12, generator=generator)
    weight = torch.randn(97, 12, generator=generator)
    expected = (hidden @ weight.T).topk(3, dim=-1).indices
    assert torch.equal(topk_tokens_in_chunks(hidden, weight, 3, chunk=7), expected)
    assert topk_tokens_in_chunks(hidden[:0], weight, 3).shape == (0, 3)
