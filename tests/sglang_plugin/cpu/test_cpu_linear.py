"""The oneDNN packed fp32 and bf16 linear against F.linear, and the hooks' fall-backs."""

import pytest
import torch
import torch.nn.functional as F

from nanospec_server.ops import packed_linear
from nanospec_server.sglang_plugin.cpu import linear as cpu_linear


class Layer(torch.nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(12, 8, dtype=dtype), requires_grad=False)


def linear_method(layer, x, bias=None):
    return F.linear(x, layer.weight, bias)


@pytest.mark.parametrize("native_bf16", [True, False], ids=["native-bf16", "bf16-as-fp32"])
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_fp32_and_bf16_layers_are_packed_in_place_and_computed_packed(
    dtype, tolerance, native_bf16, monkeypatch
):
    if native_bf16 and not packed_linear.native_bf16():
        pytest.skip("no native bf16 dot product on this CPU")
    monkeypatch.setattr(packed_linear, "native_bf16", lambda: native_bf16)
    layer = Layer(dtype)
    plain = layer.weight.detach().clone()
    cpu_linear.after_loading_hook(lambda method, layer: None, None, layer)
    assert layer.nanospec_packed.out_features == 12
    # the plain rows are freed; shape, dtype and device stay readable
    assert layer.weight.shape == (12, 8) and layer.weight.dtype == dtype
    assert layer.weight.untyped_storage().nbytes() == dtype.itemsize
    x = torch.randn(5, 8, dtype=dtype)
    out = cpu_linear.apply_hook(lambda *a: None, None, layer, x)
    assert out.dtype == dtype
    torch.testing.assert_close(out, F.linear(x, plain), rtol=tolerance, atol=tolerance)


def test_other_dtypes_stay_with_the_original_method():
    layer = Layer(torch.float16)
    cpu_linear.after_loading_hook(lambda method, layer: None, None, layer)
    assert getattr(layer, "nanospec_packed", None) is None
    x = torch.randn(3, 8, dtype=torch.float16)
    out = cpu_linear.apply_hook(lambda method, *a: linear_method(*a), None, layer, x)
    assert torch.equal(out, F.linear(x, layer.weight))


def test_one_packed_head_per_distinct_weight():
    heads = cpu_linear.PackedHeads()
    w = torch.randn(10, 4)
    assert heads.get(w) is heads.get(w)
    assert heads.get(torch.randn(10, 4)) is not heads.get(w)
