"""snip_C::quantize / snip_C::dequantize on CPU tensors (their host implementation,
csrc/quant/quantize_host.cpp) against the PyTorch reference, bit for bit: the cases of the GPU test
(tests/ops/test_quant_kernels_gpu.py; what the op promises, the spec matrix and the edge values are
tests/quant_cases.py), results independent of the number of threads, bad inputs, and the Python
entry points (snip_ops.quantize, quantize_rowcol, dequantize, fake_quantize, linear) on the op."""

import pytest
import torch

from native_build import skip_or_fail
from quant_cases import (BLACKWELL_SPECS, HOPPER_SPECS, DEQUANTIZE_SPECS, DTYPES, NON_FINITE, NVFP4_SPECS,
                         PADDING_SPECS, RECIPE_SPECS, SPECS_1D, SPECS_2D, SR_SPECS, TENSOR_AMAXES, QuantizeCases,
                         assert_outputs, assert_same, assert_same_values, bits, dispatched, edge_tensor, ids, rand,
                         snip_dequantize, snip_quantize)
from snip_ops import _ext, linear, reference
from snip_ops import quantize as quantize_fn
from snip_ops.formats import E2M1, E4M3, E5M2, QuantSpec, Rounding, ScaleKind
from snip_ops.quantize import dequantize as dequantize_fn
from snip_ops.quantize import fake_quantize, quantize_rowcol

CASES = QuantizeCases(snip_quantize, snip_dequantize)
ALL_SPECS = SPECS_1D + SPECS_2D
# As the GPU test: K % 16 == 0 (the kernels' vector paths), odd K and K % 4 != 0 (per-element
# Philox lanes), a single element, M and K around the tile (128) and block edges.
SHAPES = [(1, 1), (3, 132), (7, 129), (5, 16), (33, 1000), (130, 257)]
BIG_SHAPES = [(64, 4096), (257, 384), (300, 1040)]


@pytest.fixture(autouse=True)
def _needs_cpu_op():
    for op in ("quantize", "dequantize"):
        if not _ext.kernel_available(op, "cpu"):
            skip_or_fail(f"snip_C::{op} has no CPU implementation in this install: {_ext.build_info()}")


# ---- the GPU test's cases ----


@pytest.mark.parametrize("spec", SPECS_1D, ids=ids)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rowwise(spec, shape):
    CASES.rowwise(spec, shape)


@pytest.mark.parametrize("spec", ALL_SPECS, ids=ids)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_colwise(spec, shape):
    CASES.colwise(spec, shape)


@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
@pytest.mark.parametrize("shape", BIG_SHAPES, ids=str)
def test_recipe_specs_bigger_shapes(spec, shape):
    CASES.rowwise_then_fused(rand(shape, seed=shape[0] * 3 + shape[1]), spec)


@pytest.mark.parametrize("spec", ALL_SPECS, ids=ids)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rowwise_and_colwise_fused(spec, shape):
    CASES.fused(spec, shape)


@pytest.mark.parametrize("spec", SPECS_2D, ids=ids)
@pytest.mark.parametrize("shape", [(7, 129), (130, 257), (256, 384)], ids=str)
def test_2d_blocks_rowwise_and_shared_scales(spec, shape):
    CASES.two_d_blocks_shared(spec, shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
def test_input_dtypes(dtype, spec):
    CASES.input_dtypes(spec, dtype)


@pytest.mark.parametrize("spec", [QuantSpec(E4M3, (1, 128)), QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR)],
                         ids=ids)
def test_large(spec):
    CASES.check(rand((2048, 2048), seed=1), spec, colwise=True, seed=1, offset=2, offset_t=5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spec", ALL_SPECS, ids=ids)
def test_edge_values(spec, dtype):
    CASES.edge_values(spec, dtype)


@pytest.mark.parametrize("bad", NON_FINITE, ids=str)
@pytest.mark.parametrize("spec", ALL_SPECS, ids=ids)
def test_non_finite_blocks(spec, bad):
    CASES.non_finite_blocks(spec, bad)


@pytest.mark.parametrize("elem", [E4M3, E5M2, E2M1], ids=lambda e: e.name)
def test_round_to_nearest_even_ties(elem):
    CASES.round_to_nearest_even_ties(elem)


@pytest.mark.parametrize("spec", NVFP4_SPECS, ids=ids)
@pytest.mark.parametrize("amax", TENSOR_AMAXES, ids=str)
def test_nvfp4_tensor_amax(spec, amax):
    x = CASES.nvfp4_tensor_amax(spec, amax)
    if amax is not None:  # a Python float works as well (through the dispatcher)
        dispatched(x, spec, ("codes", "tensor_scale"), tensor_amax=amax)


def test_nvfp4_element_scale_underflow():
    CASES.nvfp4_element_scale_underflow()


@pytest.mark.parametrize("spec", SR_SPECS, ids=ids)
def test_sr_determinism_and_offsets(spec):
    CASES.sr_determinism_and_offsets(spec)


def test_sr_transposed_output_uses_the_elements_own_words():
    CASES.sr_transposed_output_uses_the_elements_own_words()


@pytest.mark.parametrize("spec", BLACKWELL_SPECS, ids=ids)
@pytest.mark.parametrize("shape", [(1, 16), (100, 200), (128, 256), (300, 1000), (257, 64)], ids=str)
@pytest.mark.parametrize("pad", [1, 32, 128])
def test_blackwell_scale_layout(spec, shape, pad):
    CASES.scale_layout(spec, shape, pad, "blackwell")


# Block rows that are and are not multiples of 4 (zero-padded columns), one and several tiles and K blocks.
@pytest.mark.parametrize("spec", HOPPER_SPECS, ids=ids)
@pytest.mark.parametrize("shape", [(1, 128), (7, 129), (128, 256), (257, 130), (300, 1000)], ids=str)
@pytest.mark.parametrize("pad", [1, 16])
def test_hopper_scale_layout(spec, shape, pad):
    CASES.scale_layout(spec, shape, pad, "hopper")


@pytest.mark.parametrize("spec", PADDING_SPECS, ids=ids)
@pytest.mark.parametrize("pad", [16, 32, 128])
def test_padding(spec, pad):
    CASES.padding(spec, pad, [(7, 129), (130, 250), (64, 256)])


@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
def test_strided_rows_and_unaligned_views(spec):
    CASES.strided_rows_and_unaligned_views(spec)


@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
def test_non_unit_inner_stride(spec):
    CASES.non_unit_inner_stride(spec)


@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
@pytest.mark.parametrize("shape", [(0, 0), (0, 256), (5, 0)], ids=str)
def test_empty(spec, shape):
    CASES.empty(spec, shape)


@pytest.mark.parametrize("spec", DEQUANTIZE_SPECS, ids=ids)
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16], ids=str)
def test_dequantize(spec, out):
    for shape in ((7, 129), (130, 256)):
        x = edge_tensor(torch.float32)[: shape[0], : shape[1]].clone()
        x[1, 0] = float("nan")  # a NaN block dequantizes to NaN
        q = reference.quantize(x, spec, seed=1, offset=2)
        got = snip_dequantize(q.codes, q.scales, q.tensor_scale, spec, shape[1], out)
        assert_same_values(got, reference.dequantize(q).to(out), f"dequantize {spec.describe()} {shape}")
        assert_same_values(dequantize_fn(q, out), reference.dequantize(q).to(out), "snip_ops.dequantize")


def test_dequantize_padded_codes():
    CASES.dequantize_padded_codes()


@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
def test_dispatcher_uses_the_op_and_matches(spec, monkeypatch):
    x = rand((65, 300), seed=10)
    calls = []
    real = torch.ops.snip_C.quantize
    monkeypatch.setattr(torch.ops.snip_C, "quantize", lambda *a: calls.append(a[2:4]) or real(*a))
    for transpose in (False, True):
        q, want = dispatched(x, spec, seed=3, offset=4, transpose=transpose)
        assert q.shape == want.shape
    row, col = quantize_rowcol(x, spec, seed=3, offset=4, offset_t=5)
    assert calls == [(True, False), (False, True), (True, True)]  # the transposes fused, x^T never built
    assert_same(row.codes, reference.quantize(x, spec, seed=3, offset=4).codes, "row codes")
    assert_same(col.codes, reference.quantize(x, spec, seed=3, offset=5, transpose=True).codes, "col codes")
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_fn(torch.full((4, 128), float("nan")), spec, checked=True)


# ---- the number of threads ----


@pytest.mark.parametrize("spec", RECIPE_SPECS + [QuantSpec(E4M3, (16, 16), ScaleKind.E8M0, Rounding.SR)], ids=ids)
def test_results_do_not_depend_on_the_thread_count(spec):
    # Large enough that every pass splits its work between the threads.
    x = rand((520, 1040), seed=21)
    kw = dict(colwise=True, seed=3, offset=4, offset_t=5)
    runs = []
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            codes, scales, codes_t, scales_t, ts = snip_quantize(x, spec, **kw)
            out = snip_dequantize(codes, scales, None if ts.numel() == 0 else ts, spec, x.shape[1], torch.float32)
            runs.append([bits(t) for t in (codes, scales, codes_t, scales_t, ts, out)])
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    assert_outputs(snip_quantize(x, spec, **kw), x, spec, **kw)


# ---- bad inputs ----


X = torch.zeros(4, 256, dtype=torch.bfloat16)


@pytest.mark.parametrize("args, match", [
    ((X.double(), "e4m3/1x128/fp32/rne"), "bfloat16, float16 or float32"),
    ((X.to(torch.int32), "e4m3/1x128/fp32/rne"), "bfloat16, float16 or float32"),
    ((X[None], "e4m3/1x128/fp32/rne"), "2-D"),
    ((X[0], "e4m3/1x128/fp32/rne"), "2-D"),
    ((X.t(), "e4m3/1x128/fp32/rne"), "unit stride"),
    ((X, "e4m3/1x64/fp32/rne"), "no kernel for block 1x64"),
    ((X, "e2m1/1x16/nvfp4/rne", True, False, 0, 0, 0, torch.ones(2)), "one-element floating"),
], ids=str)
def test_bad_inputs_are_refused(args, match):
    with pytest.raises(RuntimeError, match=match):
        torch.ops.snip_C.quantize(*args)


def test_dequantize_bad_inputs_are_refused():
    codes = torch.zeros(4, 64, dtype=torch.uint8)
    sc = torch.ones(4, 8, dtype=torch.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="2-D tensor of 1-byte codes"):
        torch.ops.snip_C.dequantize(codes.float(), sc, torch.ones(()), "e2m1/1x16/nvfp4/rne", 128, torch.float32)
    with pytest.raises(RuntimeError, match="scales must be 2-D"):
        torch.ops.snip_C.dequantize(codes, sc.float(), torch.ones(()), "e2m1/1x16/nvfp4/rne", 128, torch.float32)
    with pytest.raises(RuntimeError, match="one-element float32"):
        torch.ops.snip_C.dequantize(codes, sc, torch.ones((), dtype=torch.float64), "e2m1/1x16/nvfp4/rne", 128,
                                    torch.float32)


@pytest.mark.parametrize("spec", [QuantSpec(E4M3, (1, 128)), QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR),
                                  QuantSpec(E4M3, (128, 128), ScaleKind.E8M0)], ids=ids)
def test_non_finite_input_raises_in_checked_mode_and_propagates_otherwise(spec):
    x = rand((8, 256), torch.float32, seed=2)
    x[3, 17] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_fn(x, spec, checked=True)
    got = dequantize_fn(quantize_fn(x, spec))
    assert torch.isnan(got).any()
    assert_same_values(got, reference.dequantize(reference.quantize(x, spec)), "NaN block")


# ---- fake_quantize ----


@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
def test_fake_quantize_is_the_reference(spec):
    x = rand((70, 384), seed=3)
    for transpose in (False, True):
        got = fake_quantize(x, spec, seed=5, offset=6, transpose=transpose)
        want = reference.fake_quantize(x, spec, seed=5, offset=6, transpose=transpose)
        assert_same(got, want, f"fake_quantize transpose={transpose}")


# ---- snip_ops.linear on the op ----


@pytest.mark.parametrize("precision", ["fp8", "fp4", "nvfp4", "mxfp4", "mxfp8", "fp8_e5m2grad"])
def test_linear_on_the_op_equals_the_emulated_layer(precision):
    # The op's codes, dequantized by the op, multiplied in FP32: bit for bit the emulated layer.
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 37, 300, generator=g)
    w = torch.randn(190, 300, generator=g) * 0.05
    b = torch.randn(190, generator=g)
    dy = torch.randn(2, 37, 190, generator=g)
    out = []
    for emulate in (False, True):
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
        y = linear(xs, ws, bs, precision, seed=7, offset=3, emulate=emulate)
        y.backward(dy)
        out.append([y, xs.grad, ws.grad, bs.grad])
    for name, got, want in zip(("y", "dx", "dw", "db"), *out):
        assert_same(got, want, f"{precision} {name}")


def test_linear_quantizes_each_operand_once_on_the_op(monkeypatch):
    # x, w and dy each in one pass for both of their uses (row-wise and transposed).
    calls = []
    real = torch.ops.snip_C.quantize
    monkeypatch.setattr(torch.ops.snip_C, "quantize", lambda *a: calls.append((tuple(a[0].shape), a[2:4])) or real(*a))
    x = torch.randn(64, 256, requires_grad=True)
    w = torch.randn(128, 256, requires_grad=True)
    linear(x, w, None, "fp8").sum().backward()
    assert sorted(calls) == [((64, 128), (True, True)), ((64, 256), (True, True)), ((128, 256), (True, True))]
