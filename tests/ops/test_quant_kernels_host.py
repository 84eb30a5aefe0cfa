"""The quantize / dequantize / amax kernels (csrc/quant/*.cu) run on the CPU from their own source
through the host shim (tests/cuda_host.py), against the PyTorch reference bit for bit: the cases of
tests/ops/test_quant_kernels_gpu.py (one statement of the expected results: tests/quant_cases.py),
sized for a CPU. Every kernel path runs: row-wise (16- and 32-element runs, 1, 2, 4 or 8 lanes per
block, vector and scalar loads and stores, partial runs), tiles (column-wise, fused, 1-D and 2-D blocks, partial tiles, both
Philox streams or one), the NVFP4 amax pass (several CTAs), SR with K % 8 != 0, padding, the
Blackwell scale layout, strided and misaligned inputs, dequantize to float32 and bfloat16.

What this proves and what only a GPU shows: csrc/README.md ("The elementwise kernels on the CPU")."""

import pytest
import torch

import cuda_host
from quant_cases import (BLACKWELL_SPECS, HOPPER_SPECS, BLOCKS_1D, BLOCKS_2D, DEQUANTIZE_SPECS, DTYPES, NON_FINITE,
                         NVFP4_SPECS, PADDING_SPECS, RECIPE_SPECS, SPECS_1D, SPECS_2D, SR_SPECS, TENSOR_AMAXES,
                         QuantizeCases, assert_2d_blocks_shared, assert_outputs, assert_same_values, edge_tensor, ids,
                         rand)
from snip_ops import reference
from snip_ops.formats import E2M1, E4M3, E5M2, QuantSpec, Rounding, ScaleKind

pytestmark = pytest.mark.usefixtures("one_thread")
CASES = QuantizeCases(cuda_host.quantize, cuda_host.dequantize)


@pytest.fixture(scope="module", autouse=True)
def _shim():
    cuda_host.load()


def _path_specs():
    """Every element format x block x rounding once, the scale kinds taking turns (NVFP4 among them
    for E2M1): each kernel instantiation (element, rounding) on each block path, for the costlier
    cases."""
    out = []
    for elem in (E4M3, E5M2, E2M1):
        kinds = [ScaleKind.FP32, ScaleKind.POW2, ScaleKind.E8M0] + ([ScaleKind.NVFP4] if elem == E2M1 else [])
        for block in BLOCKS_1D + BLOCKS_2D:
            for rounding in (Rounding.RNE, Rounding.SR):
                out.append(QuantSpec(elem, block, kinds[len(out) % len(kinds)], rounding))
    return out


PATH_SPECS = _path_specs()

# K % 16 == 0 takes the vector paths, other K the scalar ones and per-element Philox (K % 8 != 0,
# K = 132 with rows starting on a multiple of 4 but not of 8); a
# single element; M and K past a tile (128) and block edges, several tiles and CTAs. The GPU test's
# shapes but its widest, (33, 1000), which runs row-wise only here.
SHAPES = [(1, 1), (3, 132), (7, 129), (5, 16), (130, 257)]


@pytest.mark.parametrize("spec", SPECS_1D, ids=ids)
@pytest.mark.parametrize("shape", SHAPES + [(33, 1000)], ids=str)
def test_rowwise(spec, shape):
    CASES.rowwise(spec, shape)


# The row kernel's other thread counts per block: 32-element runs, 2 threads per 1x64 block and 8 per
# 1x256 block (1x32 and 1x128 blocks, with 1 and 4, are in SPECS_1D), partial runs at a row's end.
OTHER_ROW_BLOCKS = [QuantSpec(elem, block, ScaleKind.FP32, rounding) for elem in (E4M3, E2M1)
                    for block in ((1, 64), (1, 256)) for rounding in (Rounding.RNE, Rounding.SR)]


@pytest.mark.parametrize("spec", OTHER_ROW_BLOCKS, ids=ids)
@pytest.mark.parametrize("shape", [(3, 132), (7, 600), (2, 48)], ids=str)
def test_rowwise_other_block_lengths(spec, shape):
    CASES.rowwise(spec, shape)


@pytest.mark.parametrize("spec", SPECS_1D + SPECS_2D, ids=ids)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_colwise(spec, shape):
    CASES.colwise(spec, shape)


@pytest.mark.parametrize("spec", SPECS_1D + SPECS_2D, ids=ids)
@pytest.mark.parametrize("shape", [(3, 132), (7, 129), (130, 257)], ids=str)
def test_rowwise_and_colwise_fused(spec, shape):
    codes, scales, codes_t, scales_t, _ = CASES.fused(spec, shape)
    if spec.block[0] > 1:
        assert_2d_blocks_shared(spec, shape, codes, scales, codes_t, scales_t)


@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
def test_recipe_specs_bigger_shapes(spec):
    CASES.check(rand((300, 1040), seed=2), spec, seed=11, offset=5)  # some 80 row-wise CTAs
    CASES.rowwise_then_fused(rand((257, 384), seed=3), spec)  # 3 x 3 tiles, a last tile row of one row


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
def test_input_dtypes(dtype, spec):
    CASES.input_dtypes(spec, dtype)


# ---- edge values ----


@pytest.mark.parametrize("spec", PATH_SPECS, ids=ids)
def test_edge_values(spec):
    for dtype in DTYPES:  # row-wise alone: float32 only
        CASES.edge_values(spec, dtype, rowwise_alone=dtype == torch.float32)


@pytest.mark.parametrize("bad", NON_FINITE, ids=str)
@pytest.mark.parametrize("spec", PATH_SPECS, ids=ids)
def test_non_finite_blocks(bad, spec):
    CASES.non_finite_blocks(spec, bad, rowwise_alone=spec.block[0] == 1)


@pytest.mark.parametrize("elem", [E4M3, E5M2, E2M1], ids=lambda e: e.name)
def test_round_to_nearest_even_ties(elem):
    CASES.round_to_nearest_even_ties(elem, rowwise_alone=True)


# ---- NVFP4's tensor scale ----


@pytest.mark.parametrize("spec", NVFP4_SPECS, ids=ids)
@pytest.mark.parametrize("amax", TENSOR_AMAXES, ids=str)
def test_nvfp4_tensor_amax(spec, amax):
    CASES.nvfp4_tensor_amax(spec, amax, rowwise_alone=spec.block[0] == 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_nvfp4_amax_pass_many_ctas(dtype):
    # The amax pass over 156 CTAs of 8-element runs, with 16-byte loads (aligned rows) or scalar ones
    # (a misaligned view): its maximum is the tensor amax behind the tensor scale and every block scale.
    spec = QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4)
    for x in (rand((300, 1064), dtype, seed=6), rand((300, 1100), dtype, seed=7)[:, 3:1030]):
        x[217, 1002] = 3e4  # the tensor max, in a CTA late in the grid
        CASES.check(x, spec, seed=1)


@pytest.mark.parametrize("shape", [(3000, 7), (2, 70001), (1, 300000), (37, 4104)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_amax_pass_grid_strides(shape, dtype):
    # Grids that step whole rows only (7 columns: one run a row), rows and runs with a carry (70001
    # columns), runs within one row (a row longer than the grid), and rows with a carry; each thread
    # takes two runs a grid stride apart. The maximum sits in each run of a thread's last step in turn,
    # against torch's abs().max() (NaN counts as Inf); aligned rows and a misaligned view.
    rows, cols = shape
    base = rand((rows, cols + 5), dtype, seed=rows)
    for view in (lambda t: t[:, :cols].contiguous(), lambda t: t[:, 3:cols + 3]):
        x = view(base)
        assert cuda_host.tensor_amax(x) == x.abs().max().float().item()
        for flat in (rows * cols - 1, rows * cols // 2, rows * cols // 3 + 5):
            y = base.clone()
            y[flat // cols, flat % cols + 3] = y[flat // cols, flat % cols] = -3e4
            y = view(y)
            peak = abs(y[flat // cols, flat % cols].float().item())
            assert cuda_host.tensor_amax(y) == y.abs().max().float().item() == peak, flat
    x = torch.zeros(shape, dtype=dtype)
    assert cuda_host.tensor_amax(x) == 0.0
    x[-1, -1] = float("nan")
    assert cuda_host.tensor_amax(x) == float("inf")


def test_nvfp4_element_scale_underflow():
    CASES.nvfp4_element_scale_underflow()


# ---- SR offsets ----


@pytest.mark.parametrize("spec", SR_SPECS, ids=ids)
def test_sr_offsets(spec):
    CASES.sr_64_bit_offsets(rand((40, 200), seed=12), spec.with_rounding(Rounding.SR), rowwise_alone=True)


def test_sr_transposed_output_uses_the_elements_own_words():
    CASES.sr_transposed_output_uses_the_elements_own_words()


# ---- layouts: padding, Blackwell scale factors ----


@pytest.mark.parametrize("spec", BLACKWELL_SPECS, ids=ids)
@pytest.mark.parametrize("shape", [(1, 16), (100, 200), (128, 256), (257, 64), (130, 520)], ids=str)
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
    CASES.padding(spec, pad, [(7, 129), (130, 250)])


# ---- shapes and strides ----


@pytest.mark.parametrize("spec", RECIPE_SPECS, ids=ids)
def test_strided_rows_and_unaligned_views(spec):
    CASES.strided_rows_and_unaligned_views(spec, rowwise_alone=True)


# ---- dequantize ----


@pytest.mark.parametrize("spec", DEQUANTIZE_SPECS, ids=ids)
@pytest.mark.parametrize("out", [torch.float32, torch.bfloat16], ids=str)
def test_dequantize(spec, out):
    for shape in ((7, 129), (130, 256)):
        x = edge_tensor(torch.float32)[: shape[0], : shape[1]].clone()
        x[1, 0] = float("nan")  # a NaN block dequantizes to NaN
        codes, scales, _, _, ts = cuda_host.quantize(x, spec, seed=1, offset=2)
        ts = ts if spec.scale == ScaleKind.NVFP4 else None
        got = cuda_host.dequantize(codes, scales, ts, spec, shape[1], out)
        want = reference.dequantize(reference.QTensor(codes, scales, spec, shape, ts))
        assert_same_values(got, want.to(out), f"dequantize {spec.describe()} {shape}")


def test_dequantize_padded_codes():
    CASES.dequantize_padded_codes()


# ---- the shim catches a broken kernel ----


@pytest.mark.parametrize("spec", [QuantSpec(E4M3, (1, 128)), QuantSpec(E2M1, (128, 128), ScaleKind.E8M0),
                                  QuantSpec(E5M2, (1, 16), rounding=Rounding.SR)], ids=ids)
def test_a_missing_barrier_is_caught(spec):
    # With __syncthreads made a no-op, the tile kernel reads partial maxima and transposed codes
    # that other threads have not written yet (the shim's fill pattern), and the outputs differ.
    lib = cuda_host.load()
    x = rand((130, 257), seed=1)
    lib.snip_cuda_host_skip_barriers(1)
    try:
        got = cuda_host.quantize(x, spec, colwise=True, seed=1, offset=2, offset_t=3)
    finally:
        lib.snip_cuda_host_skip_barriers(0)
    with pytest.raises(AssertionError, match="differ"):
        assert_outputs(got, x, spec, colwise=True, seed=1, offset=2, offset_t=3)
    CASES.check(x, spec, colwise=True, seed=1, offset=2, offset_t=3)  # and with the barriers it passes
