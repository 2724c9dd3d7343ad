"""oneDNN's packed fp32 and bf16 linear against F.linear, and the module swap the trainer uses."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanospec_server.ops import packed_linear

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
    out = packed_linear.packed_linear(x, packed_linear.pack(w), b)
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 40), st.sampled_from([256, 1024, 1536, 3000]), st.integers(0, 2**31 - 1))
def test_a_row_does_not_depend_on_the_rows_beside_it(rows, width, seed):
    # What makes a verify pass compute the logits a one-token decode computes: a row alone
    # (a decode) equals the same row among others (a verify), widths above 1024 included,
    # where oneDNN's one-row path reduces in another order.
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=gen)
    bias = torch.randn(96, generator=gen)
    packed = packed_linear.pack(torch.randn(96, width, generator=gen))
    together = packed_linear.packed_linear(x, packed, bias)
    for i in (0, rows // 2, rows - 1):
        alone = packed_linear.packed_linear(x[i : i + 1], packed, bias)
        assert torch.equal(alone[0], together[i])


@pytest.fixture(params=[True, False], ids=["native-bf16", "bf16-as-fp32"])
def bf16_kernel(request, monkeypatch) -> bool:
    """Both ways a bf16 weight computes: oneDNN's bf16 kernel (where the CPU has one) and
    fp32 (elsewhere)."""
    if request.param and not packed_linear.native_bf16():
        pytest.skip("no native bf16 dot product on this CPU")
    monkeypatch.setattr(packed_linear, "native_bf16", lambda: request.param)
    return request.param


# the fixture's setting holds for every example
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.integers(2, 40),
    st.sampled_from([64, 1024, 1536, 3000]),
    st.sampled_from([96, 997, 2048]),
    st.integers(0, 2**31 - 1),
)
def test_a_bf16_row_does_not_depend_on_the_rows_beside_it(bf16_kernel, rows, width, out, seed):
    # F.linear in bf16 rounds a row differently beside other rows at these widths; a
    # packed bf16 weight computes a row alone and in company the same way.
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=gen).bfloat16()
    weight = (torch.randn(out, width, generator=gen) * width**-0.5).bfloat16()
    bias = torch.randn(out, generator=gen).bfloat16()
    packed = packed_linear.pack(weight)
    assert packed.compute_dtype == (torch.bfloat16 if bf16_kernel else torch.float32)
    assert packed.dtype == torch.bfloat16  # what the layer's hook compares inputs with
    together = packed_linear.packed_linear(x, packed, bias)
    assert together.dtype == torch.bfloat16
    torch.testing.assert_close(together, F.linear(x, weight, bias), rtol=2e-2, atol=2e-2)
    for i in (0, rows // 2, rows - 1):
        alone = packed_linear.packed_linear(x[i : i + 1], packed, bias)
        assert torch.equal(alone[0], together[i])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_chosen_layout_is_row_invariant_from_decode_to_prefill_sizes(dtype):
    """A row alone (a decode) equals the same row among up to 300 others (a verify, a
    prompt prefilled beside others), for weights as wide as a model's, in the layout the
    probe chose: on an AMX host a bf16 weight packed for 8 rows rounds calls of over 32
    rows apart."""
    if dtype == torch.bfloat16 and not packed_linear.native_bf16():
        pytest.skip("no native bf16 dot product on this CPU")
    chosen = packed_linear.layout(dtype)
    assert packed_linear.row_invariant(chosen, dtype)
    gen = torch.Generator().manual_seed(0)
    for out_features, in_features in [(4864, 896), (1536, 8960)]:
        weight = (torch.randn(out_features, in_features, generator=gen) * 0.03).to(dtype)
        packed = packed_linear.pack(weight)
        x = torch.randn(300, in_features, generator=gen).to(dtype)
        rows = [0, 7, 40, 150, 299]
        alone = {i: packed_linear.packed_linear(x[i : i + 1], packed, None)[0] for i in rows}
        for count in (2, 8, 33, 41, 129, 300):
            together = packed_linear.packed_linear(x[:count], packed, None)
            for i in (i for i in rows if i < count):
                assert torch.equal(together[i], alone[i]), (out_features, count, i)


def test_wide_weights_are_packed_in_row_invariant_blocks():
    width = packed_linear.layout().width
    assert width in packed_linear.K_BLOCK_CANDIDATES
    packed = packed_linear.pack(torch.randn(8, 2 * width + 3))
    assert len(packed.blocks) == 3 and packed.in_features == 2 * width + 3
    x = torch.randn(4, 2 * width + 3)
    w = torch.randn(8, 2 * width + 3)
    out = packed_linear.packed_linear(x, packed_linear.pack(w), None)
    torch.testing.assert_close(out, F.linear(x, w), rtol=1e-4, atol=1e-3)


def test_leading_dimensions_are_kept():
    x = torch.randn(2, 3, 16)
    w = torch.randn(8, 16)
    out = packed_linear.packed_linear(x, packed_linear.pack(w), None)
    assert out.shape == (2, 3, 8)
    torch.testing.assert_close(out, F.linear(x, w), rtol=1e-5, atol=1e-5)


def test_packing_a_model_keeps_its_outputs_and_ties():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Embedding(50, 16),
        torch.nn.Linear(16, 32),
        torch.nn.GELU(),
        torch.nn.Sequential(torch.nn.Linear(32, 16, bias=False)),
        torch.nn.Linear(16, 50, bias=False),
    )
    model[4].weight = model[0].weight  # a tied LM head keeps the embedding's rows
    model.eval()
    ids = torch.randint(0, 50, (3, 7))
    with torch.inference_mode():
        expected = model(ids)
        assert packed_linear.pack_linear_layers(model) == 3
        got = model(ids)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert model[0].weight.shape == (50, 16)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_only_fp32_cpu_layers_are_packed():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4).to(torch.bfloat16), torch.nn.Linear(4, 4))
    assert packed_linear.pack_linear_layers(model) == 1
    assert isinstance(model[0], torch.nn.Linear)


def test_row_counts_fall_into_few_sizes():
    # Each row count a call computes costs oneDNN a cached primitive: a bounded set of sizes
    # keeps a server's memory flat; decodes and small verifies keep their exact count.
    sizes = {packed_linear.row_bucket(rows) for rows in range(1, 4097)}
    assert len(sizes) < 100
    assert all(packed_linear.row_bucket(rows) == rows for rows in range(9))
    assert all(rows <= packed_linear.row_bucket(rows) < rows + 64 for rows in range(1, 4097))
    x = torch.randn(37, 300)
    w = torch.randn(20, 300)
    out = packed_linear.packed_linear(x, packed_linear.pack(w), None)
    assert out.shape == (37, 20)  # the padding rows are not returned
    torch.testing.assert_close(out, F.linear(x, w), rtol=1e-4, atol=1e-4)
