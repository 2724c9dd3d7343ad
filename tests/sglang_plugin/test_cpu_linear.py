"""The oneDNN packed fp32 linear against F.linear, and the hooks' fall-backs."""

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from nanospec_server.sglang_plugin import cpu_linear

shapes = st.tuples(
    st.integers(1, 40),  # rows
    st.integers(1, 96),  # in features
    st.integers(1, 130),  # out features
    st.booleans(),  # bias
    st.integers(0, 2**31 - 1),  # seed
)


@settings(max_examples=40, deadline=None)
@given(shapes)
def test_packed_linear_equals_f_linear(shape):
    rows, k, n, with_bias, seed = shape
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen)
    w = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if with_bias else None
    out = cpu_linear.packed_linear(x, cpu_linear.pack(w), b)
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 64), st.integers(0, 2**31 - 1))
def test_a_row_does_not_depend_on_the_rows_beside_it(rows, seed):
    # What makes a verify pass compute the logits a one-token decode computes.
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 256, generator=gen)
    packed = cpu_linear.pack(torch.randn(384, 256, generator=gen))
    together = cpu_linear.packed_linear(x, packed, None)
    for i in (0, rows // 2, rows - 1):
        alone = cpu_linear.packed_linear(x[i : i + 1], packed, None)
        assert torch.equal(alone[0], together[i])


def test_leading_dimensions_are_kept():
    x = torch.randn(2, 3, 16)
    w = torch.randn(8, 16)
    out = cpu_linear.packed_linear(x, cpu_linear.pack(w), None)
    assert out.shape == (2, 3, 8)
    torch.testing.assert_close(out, F.linear(x, w), rtol=1e-5, atol=1e-5)


class Layer(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(12, 8, dtype=dtype), requires_grad=False)


def linear_method(layer, x, bias=None):
    return F.linear(x, layer.weight, bias)


def test_fp32_layers_are_packed_in_place_and_computed_packed():
    layer = Layer(torch.float32)
    plain = layer.weight.detach().clone()
    cpu_linear.after_loading_hook(lambda method, layer: None, None, layer)
    assert layer.nanospec_packed and layer.weight.is_mkldnn
    x = torch.randn(5, 8)
    out = cpu_linear.apply_hook(lambda *a: None, None, layer, x)
    torch.testing.assert_close(out, F.linear(x, plain), rtol=1e-5, atol=1e-5)


def test_other_dtypes_stay_with_the_original_method():
    layer = Layer(torch.bfloat16)
    cpu_linear.after_loading_hook(lambda method, layer: None, None, layer)
    assert not getattr(layer, "nanospec_packed", False) and not layer.weight.is_mkldnn
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    out = cpu_linear.apply_hook(lambda method, *a: linear_method(*a), None, layer, x)
    assert torch.equal(out, F.linear(x, layer.weight))


def test_one_packed_head_per_distinct_weight():
    heads = cpu_linear.PackedHeads()
    w = torch.randn(10, 4)
    assert heads.get(w) is heads.get(w)
    assert heads.get(torch.randn(10, 4)) is not heads.get(w)
