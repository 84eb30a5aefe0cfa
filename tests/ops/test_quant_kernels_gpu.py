"""snip_C::quantize / snip_C::dequantize against the PyTorch reference (run on the CPU, the oracle),
bit for bit: every kernel-backed spec, row-wise / column-wise / fused outputs, odd shapes, edge
values, SR determinism and offsets, padding, the Blackwell scale layout, and the dispatcher.

What the op promises (`expected`), the cases (`QuantizeCases`), the spec matrix and the edge values
are in tests/quant_cases.py, shared with tests/ops/test_quant_kernels_host.py, which runs the same
kernels on the CPU, and tests/ops/test_quantize_cpu_op.py, the op's CPU implementation."""

from functools import partial

import pytest
import torch

import quant_cases
from quant_cases import (BLACKWELL_SPECS, HOPPER_SPECS, DEQUANTIZE_SPECS, DTYPES, NON_FINITE, NVFP4_SPECS,
                         PADDING_SPECS, RECIPE_SPECS, SPECS_1D, SPECS_2D, SR_SPECS, TENSOR_AMAXES, QuantizeCases,
                         assert_outputs, assert_same, assert_same_values, dispatched, ids, snip_dequantize,
                         snip_quantize)
from snip_ops import _ext, reference
from snip_ops import quantize as quantize_fn
from snip_ops.formats import E2M1, E4M3, E5M2, QuantSpec, Rounding, ScaleKind
from snip_ops.quantize import dequantize as dequantize_fn, quantize_rowcol

pytestmark = pytest.mark.gpu
DEV = "cuda"
CASES = QuantizeCases(snip_quantize, snip_dequantize, DEV)


@pytest.fixture(autouse=True)
def _needs_kernel():
    for op in ("quantize", "dequantize"):
        if not _ext.kernel_available(op, DEV):
            pytest.skip(f"{op} not compiled for this GPU: {_ext.build_info()}")


rand = partial(quant_cases.rand, device=DEV)
edge_tensor = partial(quant_cases.edge_tensor, device=DEV)


# ---- shapes (the specs: quant_cases) ----

# K % 16 == 0 takes the vector paths, odd K the scalar ones and per-element Philox (K % 4 != 0);
# M and K around tile (128) and block edges. Every spec runs on SHAPES, the recipes' specs also on
# BIG_SHAPES (the CPU reference, ~0.1-1 us per element, bounds the sizes).
SHAPES = [(1, 1), (3, 132), (7, 129), (5, 16), (33, 1000), (130, 257)]
BIG_SHAPES = [(64, 4096), (257, 384), (300, 1040)]


@pytest.mark.parametrize("spec", SPECS_1D, ids=ids)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rowwise(spec, shape):
    CASES.rowwise(spec, shape)


@pytest.mark.parametrize("spec", SPECS_1D + SPECS_2D, ids=ids)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_colwise(spec, shape):
    CASES.colwise(spec, shape)


@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
@pytest.mark.parametrize("shape", BIG_SHAPES, ids=str)
def test_recipe_specs_bigger_shapes(spec, shape):
    CASES.rowwise_then_fused(rand(shape, seed=shape[0] * 3 + shape[1]), spec)


@pytest.mark.parametrize("spec", SPECS_1D + SPECS_2D, ids=ids)
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


@pytest.mark.parametrize("spec", [QuantSpec(E4M3, (1, 128)), QuantSpec(E4M3, (128, 128)),
                                  QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR)], ids=ids)
def test_large(spec):
    # Many CTAs: more 128x128 tiles (33 x 17) than any GPU holds CTAs of the tile kernel at once, so
    # each CTA quantizes several, edge tiles (loaded directly) between whole ones (prefetched).
    x = rand((4100, 2060), seed=1)
    CASES.check(x, spec, colwise=True, seed=1, offset=2, offset_t=5)


# ---- edge values ----


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spec", SPECS_1D + SPECS_2D, ids=ids)
def test_edge_values(dtype, spec):
    CASES.edge_values(spec, dtype)


@pytest.mark.parametrize("bad", NON_FINITE, ids=str)
@pytest.mark.parametrize("spec", SPECS_1D + SPECS_2D, ids=ids)
def test_non_finite_blocks(bad, spec):
    CASES.non_finite_blocks(spec, bad)


@pytest.mark.parametrize("elem", [E4M3, E5M2, E2M1], ids=lambda e: e.name)
def test_round_to_nearest_even_ties(elem):
    CASES.round_to_nearest_even_ties(elem)


# ---- NVFP4's tensor scale ----


@pytest.mark.parametrize("spec", NVFP4_SPECS, ids=ids)
@pytest.mark.parametrize("amax", TENSOR_AMAXES, ids=str)
def test_nvfp4_tensor_amax(spec, amax):
    x = CASES.nvfp4_tensor_amax(spec, amax)
    if amax is not None:  # a Python float and a CPU tensor work as well (through the dispatcher)
        dispatched(x, spec, ("codes", "tensor_scale"), tensor_amax=amax)


def test_nvfp4_element_scale_underflow():
    CASES.nvfp4_element_scale_underflow()


# ---- SR: determinism and offsets ----


@pytest.mark.parametrize("spec", SR_SPECS, ids=ids)
def test_sr_determinism_and_offsets(spec):
    CASES.sr_determinism_and_offsets(spec)


def test_sr_transposed_output_uses_the_elements_own_words():
    CASES.sr_transposed_output_uses_the_elements_own_words()


# ---- layouts: padding, Blackwell scale factors ----


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


# ---- shapes and strides ----


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


def test_runs_on_current_stream():
    x = rand((128, 1024), seed=7)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    spec = QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR)
    with torch.cuda.stream(s):
        got = snip_quantize(x, spec, colwise=True, seed=1, offset=2, offset_t=3)
    s.synchronize()
    assert_outputs(got, x, spec, colwise=True, seed=1, offset=2, offset_t=3)


# ---- dequantize ----


@pytest.mark.parametrize("spec", DEQUANTIZE_SPECS, ids=ids)
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16], ids=str)
def test_dequantize(spec, out):
    for shape in ((7, 129), (130, 256)):
        x = edge_tensor(torch.float32)[: shape[0], : shape[1]].to(DEV) if shape[1] <= 288 else rand(shape)
        x[1, 0] = float("nan")  # a NaN block dequantizes to NaN
        q = quantize_fn(x, spec, seed=1, offset=2)
        got = dequantize_fn(q, out)
        want = reference.dequantize(reference.QTensor(q.codes.cpu(), q.scales.cpu(), spec, q.shape,
                                                      None if q.tensor_scale is None else q.tensor_scale.cpu()))
        assert_same_values(got, want.to(out), f"dequantize {spec.describe()} {shape}")


def test_dequantize_padded_codes():
    CASES.dequantize_padded_codes()


# ---- the dispatcher on CUDA tensors ----


@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
def test_dispatcher_uses_the_kernel_and_matches(spec):
    x = rand((65, 300), seed=10)
    for transpose in (False, True):
        q, want = dispatched(x, spec, seed=3, offset=4, transpose=transpose)
        assert q.codes.device == x.device and q.shape == want.shape
    row, col = quantize_rowcol(x, spec, seed=3, offset=4, offset_t=5)
    assert_same(row.codes, reference.quantize(x.cpu(), spec, seed=3, offset=4).codes, "row codes")
    assert_same(col.codes, reference.quantize(x.cpu(), spec, seed=3, offset=5, transpose=True).codes, "col codes")
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_fn(torch.full((4, 128), float("nan"), device=DEV), spec, checked=True)


def test_bandwidth_sanity():
    # Not a benchmark (bench/bench_quant.py is): catches a gross regression, e.g. the scalar path
    # on aligned input. H100/H200/B200 all move > 2 TB/s; the fp8 row-wise kernel must beat 1 TB/s.
    x = rand((8192, 8192), seed=1)
    spec = QuantSpec(E4M3, (1, 128))
    for _ in range(3):
        snip_quantize(x, spec)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        snip_quantize(x, spec)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / 20
    moved = x.numel() * (2 + 1) + x.numel() // 128 * 4
    assert moved / seconds > 1.0e12, f"{moved / seconds / 1e9:.0f} GB/s"
