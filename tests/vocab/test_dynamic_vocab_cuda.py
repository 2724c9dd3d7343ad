"""CUDA only: the per-step path captured in a CUDA graph (side-stream refresh included)
replays to the same results as eager CPU execution."""

import pytest
import torch

from nanospec_server.vocab import DynamicVocab

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU here")


def test_append_refresh_topk_replay_in_a_cuda_graph():
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(997, 64, generator=generator)
    settings = dict(num_slots=4, w_cap=64, w_max=40, always_active=(0,))
    gpu, cpu = DynamicVocab(weight.cuda(), **settings), DynamicVocab(weight, **settings)
    slots, row_slots = torch.tensor([1, 3]), torch.tensor([1, 1, 3, 3, 3])
    tokens = torch.zeros(2, 24, dtype=torch.int64, device="cuda")
    hidden = torch.zeros(5, 64, device="cuda")

    def step(vocab, device):
        vocab.append(slots.to(device), tokens.to(device))
        vocab.refresh(slots.to(device))
        return vocab.topk(hidden.to(device), row_slots.to(device), 6)

    def new_inputs():
        tokens.copy_(torch.randint(0, 997, tokens.shape, generator=generator))
        hidden.copy_(torch.randn(hidden.shape, generator=generator))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernel builds and Triton compiles
        for _ in range(3):
            new_inputs()
            step(gpu, "cuda")
            step(cpu, "cpu")
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        probs, ids = step(gpu, "cuda")
    for _ in range(5):
        new_inputs()
        graph.replay()
        expected_probs, expected_ids = step(cpu, "cpu")
        torch.testing.assert_close(probs.cpu(), expected_probs, atol=1e-4, rtol=1e-3)
        assert torch.equal(ids.cpu(), expected_ids)
    assert torch.equal(gpu.active_size(slots.cuda()).cpu(), cpu.active_size(slots))
