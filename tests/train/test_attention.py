"""grouped_sdpa equals transformers' sdpa attention (which copies K/V per query head)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from nanospec_server.train.attention import grouped_sdpa


class _Layer(torch.nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups, self.is_causal = groups, True


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 4), kv_heads=st.integers(1, 3), groups=st.integers(1, 4),
    q_len=st.integers(1, 6), past=st.integers(0, 6), masked=st.booleans(), seed=st.integers(0, 99),
)  # fmt: skip
def test_grouped_sdpa_equals_transformers_sdpa(
    batch: int, kv_heads: int, groups: int, q_len: int, past: int, masked: bool, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    kv_len, dim = past + q_len, 8
    query = torch.randn(batch, kv_heads * groups, q_len, dim, generator=generator)
    key, value = (torch.randn(batch, kv_heads, kv_len, dim, generator=generator) for _ in range(2))
    causal = torch.ones(q_len, kv_len, dtype=torch.bool).tril(past)
    mask = None
    if masked:  # left padding: a row's first keys are hidden; every query keeps its own key
        pad = torch.randint(0, past + 1, (batch,), generator=generator)
        visible = torch.arange(kv_len)[None, :] >= pad[:, None]
        mask = (causal[None] & visible[:, None, :])[:, None]
    layer = _Layer(groups)
    want, _ = sdpa_attention_forward(layer, query, key, value, mask if masked else causal[None, None])  # fmt: skip
    got, _ = grouped_sdpa(layer, query, key, value, mask, scaling=dim**-0.5)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("q_len", [1, 5])
def test_no_mask_means_causal(q_len: int) -> None:
    query, key, value = (
        torch.randn(2, 4, q_len, 8),
        torch.randn(2, 2, 7, 8),
        torch.randn(2, 2, 7, 8),
    )
    causal = torch.ones(q_len, 7, dtype=torch.bool).tril(7 - q_len)[None, None]
    want, _ = grouped_sdpa(_Layer(2), query, key, value, causal.expand(2, 1, -1, -1))
    got, _ = grouped_sdpa(_Layer(2), query, key, value, None)
    torch.testing.assert_close(got, want)
