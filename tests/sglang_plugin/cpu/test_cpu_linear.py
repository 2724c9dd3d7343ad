"""The oneDNN packed fp32 linear against F.linear, and the hooks' fall-backs."""

import torch
import torch.nn.functional as F

from nanospec_server.sglang_plugin.cpu import linear as cpu_linear


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
    assert layer.nanospec_packed.out_features == 12
    # the plain rows are freed; shape, dtype and device stay readable
    assert layer.weight.shape == (12, 8) and layer.weight.untyped_storage().nbytes() == 4
    x = torch.randn(5, 8)
    out = cpu_linear.apply_hook(lambda *a: None, None, layer, x)
    torch.testing.assert_close(out, F.linear(x, plain), rtol=1e-5, atol=1e-5)


def test_other_dtypes_stay_with_the_original_method():
    layer = Layer(torch.bfloat16)
    cpu_linear.after_loading_hook(lambda method, layer: None, None, layer)
    assert getattr(layer, "nanospec_packed", None) is None
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    out = cpu_linear.apply_hook(lambda method, *a: linear_method(*a), None, layer, x)
    assert torch.equal(out, F.linear(x, layer.weight))


def test_one_packed_head_per_distinct_weight():
    heads = cpu_linear.PackedHeads()
    w = torch.randn(10, 4)
    assert heads.get(w) is heads.get(w)
    assert heads.get(torch.randn(10, 4)) is not heads.get(w)
