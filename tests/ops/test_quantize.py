"""Block quantization (reference): scale rules, codes vs torch/ml_dtypes casts, padding, layouts, errors."""

import ml_dtypes
import numpy as np
import pytest
import torch

import snip_ops
from snip_ops import gemm
from snip_ops.formats import E2M1, E4M3, E5M2, QuantSpec, Rounding, ScaleKind, exmy, recipe
from snip_ops.reference import dequantize, fake_quantize, quantize, unpack_codes

SPECS = {
    "fp8_1x128": QuantSpec(E4M3, (1, 128)),
    "fp8_128x128": QuantSpec(E4M3, (128, 128)),
    "e5m2_pow2": QuantSpec(E5M2, (1, 128), ScaleKind.POW2),
    "fp8_tensorwise": QuantSpec(E4M3, (0, 0)),
    "fp8_rowwise": QuantSpec(E4M3, (1, 0)),
    "mxfp8": QuantSpec(E4M3, (1, 32), ScaleKind.E8M0),
    "nvfp4": QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4),
    "nvfp4_16x16": QuantSpec(E2M1, (16, 16), ScaleKind.NVFP4),
    "mxfp4": QuantSpec(E2M1, (1, 32), ScaleKind.E8M0),
    "fp4_1x128": QuantSpec(E2M1, (1, 128)),
    "fp4_128x128_sr": QuantSpec(E2M1, (128, 128), rounding=Rounding.SR),
    "e3m2_sr": QuantSpec(exmy(3, 2, "none"), (1, 32), ScaleKind.E8M0, Rounding.SR),
    "e8m3_none": QuantSpec(exmy(8, 3), (1, 1), ScaleKind.NONE),
}
SHAPES = [(1, 1), (7, 129), (33, 300), (130, 257), (0, 5), (4, 0)]


def _same(a, b):
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dequantize_of_quantize_equals_fake_quantize(name, shape):
    spec = SPECS[name]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(7)) * 10
    q = quantize(x, spec, seed=1, offset=2)
    assert q.shape == shape
    d = dequantize(q)
    assert d.shape == shape and d.dtype == torch.float32
    assert _same(d, fake_quantize(x, spec, seed=1, offset=2))
    if x.numel():
        err = (d - x).norm() / x.norm()
        assert err < 2.0 ** -spec.element.man_bits  # half an ulp, doubled for subnormal tails


@pytest.mark.parametrize("name", ["fp8_1x128", "fp8_128x128", "e5m2_pow2", "fp8_tensorwise", "fp8_rowwise"])
def test_fp8_codes_are_torch_casts_of_scaled_values(name):
    spec = SPECS[name]
    x = torch.randn(70, 300) * torch.logspace(-3, 3, 300)
    q = quantize(x, spec)
    br, bc = spec.block[0] or 70, spec.block[1] or 300
    amax = torch.nn.functional.pad(x.abs(), (0, -300 % bc, 0, -70 % br)).reshape(-(-70 // br), br, -(-300 // bc), bc).amax((1, 3))
    scale = amax / spec.element.max_finite
    if spec.scale == ScaleKind.POW2:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    assert torch.equal(q.scales, scale)
    s = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:70, :300]
    dtype = torch.float8_e4m3fn if spec.element == E4M3 else torch.float8_e5m2
    expected = (x / s).clamp(-spec.element.max_finite, spec.element.max_finite).to(dtype)
    assert torch.equal(q.codes.view(torch.uint8), expected.view(torch.uint8))


def test_e8m0_scales_match_torch_and_ml_dtypes():
    x = torch.randn(9, 96) * torch.logspace(-20, 20, 9)[:, None]
    q = quantize(x, SPECS["mxfp8"])
    assert q.scales.dtype == torch.float8_e8m0fnu
    s = q.scales.float()
    amax = x.abs().reshape(9, 3, 32).amax(-1)
    assert torch.equal(s, torch.exp2(torch.ceil(torch.log2(amax / 448.0))))
    np_scales = s.numpy().astype(ml_dtypes.float8_e8m0fnu)
    assert np.array_equal(np_scales.view(np.uint8), q.scales.view(torch.uint8).numpy())
    # the scaled amax never exceeds the element maximum: no saturation with E8M0 "round up" scales
    assert (amax / s <= 448).all()


def test_fp4_packing_low_nibble_first_and_odd_width():
    x = torch.tensor([[1.0, -2.0, 6.0, 0.5, 3.0]])
    q = quantize(x, QuantSpec(E2M1, (1, 0), ScaleKind.FP32))
    # scale 1 (amax 6): codes 1.0 -> 0x2, -2.0 -> 0xC, 6.0 -> 0x7, 0.5 -> 0x1, 3.0 -> 0x5, pad 0
    assert q.codes.dtype == torch.uint8 and q.codes.tolist() == [[0xC2, 0x17, 0x05]]
    assert unpack_codes(q).tolist() == [[0x2, 0xC, 0x7, 0x1, 0x5]]
    np_codes = x.numpy().astype(ml_dtypes.float4_e2m1fn).view(np.uint8) & 0xF
    assert unpack_codes(q).numpy().tolist() == np_codes.tolist()


def test_fp4_packing_matches_torch_float4_x2_layout():
    x = torch.randn(4, 32)
    q = quantize(x, SPECS["mxfp4"])
    packed = q.codes.view(torch.float4_e2m1fn_x2)
    assert packed.shape == (4, 16)
    assert torch.equal(packed.view(torch.uint8), q.codes)


def test_nvfp4_two_level_scales():
    x = torch.randn(8, 64) * 3
    x[2, :16] = 0
    q = quantize(x, SPECS["nvfp4"])
    t = x.abs().amax() / (448 * 6)
    assert torch.equal(q.tensor_scale, t)
    assert q.scales.dtype == torch.float8_e4m3fn
    b = (x.abs().reshape(8, 4, 16).amax(-1) / (t * 6)).to(torch.float8_e4m3fn).float()
    b[2, 0] = 1.0  # all-zero block
    assert torch.equal(q.scales.float(), b)
    assert (q.dequantize()[2, :16] == 0).all()
    # an explicit tensor amax (e.g. from a previous step) is honoured
    q2 = quantize(x, SPECS["nvfp4"], tensor_amax=2 * x.abs().amax())
    assert torch.equal(q2.tensor_scale, 2 * x.abs().amax() / (448 * 6))


def test_nvfp4_tiny_block_keeps_a_nonzero_scale():
    x = torch.ones(1, 32)
    x[0, 16:] = 1e-12
    q = quantize(x, SPECS["nvfp4"])
    assert q.scales.float()[0, 1] == E4M3.min_subnormal


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_nvfp4_underflowing_element_scale_gives_zero_codes(sign):
    """b * t can underflow for a tensor scale near 2^-149: zero codes, zero values, never NaN."""
    x = torch.zeros(2, 16)
    x[0, 0] = sign * 2.0**-149
    x[1, 3] = sign * 2.0**-148
    q = quantize(x, SPECS["nvfp4"])
    assert q.tensor_scale == 2.0**-149  # amax / 2688 underflowed; kept at the smallest positive float
    assert (q.codes == 0).all()
    assert torch.equal(q.dequantize(), torch.zeros(2, 16))
    assert torch.equal(fake_quantize(x, SPECS["nvfp4"]), torch.zeros(2, 16))


@pytest.mark.parametrize("name", ["fp8_1x128", "mxfp4", "fp4_1x128", "nvfp4"])
def test_zero_blocks_get_scale_one(name):
    x = torch.zeros(3, 256)
    q = quantize(x, SPECS[name])
    assert (q.scales.float() == 1).all() and (q.dequantize() == 0).all()


@pytest.mark.parametrize("name", ["fp8_1x128", "fp8_128x128", "mxfp8", "mxfp4", "fp4_1x128"])
def test_non_finite_blocks_become_nan_never_finite(name):
    spec = SPECS[name]
    x = torch.randn(4, 256)
    x[1, 5] = float("nan")
    x[2, 200] = float("inf")
    q = quantize(x, spec)
    d = q.dequantize()
    br, bc = spec.block
    assert torch.isnan(d[1, 5]) and torch.isnan(d[2, 200])
    bad_nan = torch.isnan(d)
    if br == 1:  # exactly the blocks holding NaN/Inf are NaN, the rest are finite
        start = 200 // bc * bc
        assert bad_nan[1, :bc].all() and bad_nan[2, start:start + bc].all()
        assert bad_nan.sum() == 2 * bc
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize(x, spec, checked=True)
    with pytest.raises(ValueError, match="NaN or Inf"):
        snip_ops.quantize(x, spec, checked=True)


def test_huge_and_tiny_magnitudes():
    x = torch.tensor([[3e38, -1e-38, 1.0, 1e-45] + [0.0] * 124, [1e-30] * 128])
    q = quantize(x, SPECS["fp8_1x128"])
    d = q.dequantize()
    assert torch.isfinite(d).all()
    # each block's amax maps to 448 exactly: what is left is the scale's and the product's rounding
    assert d[0, 0] == pytest.approx(float(x[0, 0]), rel=2**-22) and d[1, 0] == pytest.approx(float(x[1, 0]), rel=2**-22)


@pytest.mark.parametrize("name", ["fp8_1x128", "mxfp4", "fp4_128x128_sr", "nvfp4"])
def test_transpose_variant(name):
    spec = SPECS[name]
    x = torch.randn(45, 150)
    qt = quantize(x, spec, seed=3, offset=4, transpose=True)
    assert qt.shape == (150, 45)
    if spec.rounding == Rounding.RNE:
        ref = quantize(x.t().contiguous(), spec)
        assert torch.equal(unpack_codes(qt), unpack_codes(ref))
        assert torch.equal(qt.scales.float(), ref.scales.float())
    else:  # SR words belong to the input element: the transposed copy of x uses x's linear index
        words_equal = quantize(x, spec, seed=3, offset=4).dequantize().t()
        ref_t = quantize(x.t().contiguous(), spec, seed=3, offset=4).dequantize()
        assert torch.equal(words_equal, qt.dequantize())
        assert not torch.equal(ref_t, qt.dequantize())


@pytest.mark.parametrize("quantizer", ["reference", "snip_ops"])
@pytest.mark.parametrize("shape", [(200, 300), (201, 299), (1, 7), (7, 1), (0, 5), (130, 129)])
def test_square_blocks_serve_w_and_w_transposed(shape, quantizer):
    """QTensor.t() moves w's codes (bytes, or nibbles of packed FP4) to those of quantizing w^T, bit for bit,
    in the same storage dtype, contiguous; odd sizes exercise the packing's padding nibble."""
    quantize_with = quantize if quantizer == "reference" else snip_ops.quantize
    w = torch.randn(*shape)
    for spec in (SPECS["fp8_128x128"], QuantSpec(E5M2, (128, 128)), QuantSpec(E2M1, (128, 128)),
                 recipe("nvfp4_train").weight, QuantSpec(E2M1, (16, 16), ScaleKind.E8M0)):
        q, want = quantize_with(w, spec), quantize_with(w, spec, transpose=True)
        got = q.t()
        assert got.shape == want.shape and got.codes.dtype == want.codes.dtype and got.codes.is_contiguous()
        assert torch.equal(got.codes.view(torch.uint8), want.codes.view(torch.uint8)), spec.describe()
        assert torch.equal(got.scales.float(), want.scales.float()) and got.tensor_scale is q.tensor_scale
        if spec.element == E2M1:  # stored as torch's packed FP4 dtype, the codes keep it
            as_fp4 = type(q)(q.codes.view(torch.float4_e2m1fn_x2), q.scales, spec, q.shape, q.tensor_scale)
            assert as_fp4.t().codes.dtype == torch.float4_e2m1fn_x2
            assert torch.equal(as_fp4.t().codes.view(torch.uint8), want.codes.view(torch.uint8))
    with pytest.raises(ValueError, match="square"):
        quantize(w, SPECS["fp8_1x128"]).t()


def test_bf16_and_fp16_inputs_equal_their_float32_values():
    x = torch.randn(16, 128).to(torch.bfloat16)
    for spec in (SPECS["fp8_1x128"], SPECS["nvfp4"]):
        assert torch.equal(quantize(x, spec).dequantize(), quantize(x.float(), spec).dequantize())
    h = torch.randn(16, 128).half()
    assert torch.equal(quantize(h, SPECS["mxfp8"]).dequantize(), quantize(h.float(), SPECS["mxfp8"]).dequantize())


def test_non_contiguous_input_is_accepted():
    x = torch.randn(64, 256)[:, ::2]
    assert torch.equal(quantize(x, SPECS["fp8_1x128"]).dequantize(), quantize(x.contiguous(), SPECS["fp8_1x128"]).dequantize())


def test_bad_inputs():
    spec = SPECS["fp8_1x128"]
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        quantize(torch.ones(2, 2, dtype=torch.int32), spec)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        quantize(torch.ones(2, 2, dtype=torch.float64), spec)
    with pytest.raises(ValueError, match="2-D"):
        quantize(torch.ones(2, 2, 2), spec)
    with pytest.raises(TypeError, match="torch.Tensor"):
        quantize([[1.0]], spec)
    with pytest.raises(TypeError, match="QuantSpec"):
        quantize(torch.ones(2, 2), "fp8")
    with pytest.raises(ValueError, match="nvfp4"):
        QuantSpec(E4M3, (1, 16), ScaleKind.NVFP4)
    with pytest.raises(ValueError, match="block"):
        QuantSpec(E4M3, (-1, 16))
    with pytest.raises(ValueError, match="tensor_amax"):
        quantize(torch.ones(2, 2), spec, tensor_amax=1.0)
    with pytest.raises(ValueError):
        QuantSpec(E4M3, (1, 32), "e9m0")


def test_spec_string_round_trip():
    for spec in SPECS.values():
        assert QuantSpec.parse(spec.describe()) == spec
    with pytest.raises(ValueError, match="cannot parse"):
        QuantSpec.parse("e4m3-1x128")


@pytest.mark.parametrize("name", ["fp8_1x128", "e5m2_pow2", "mxfp8", "mxfp4", "nvfp4"])
def test_subnormal_amax_never_gives_a_zero_scale(name):
    x = torch.tensor([[1e-44, -3e-45] + [0.0] * 126, [1e-40] * 128])
    q = quantize(x, SPECS[name])
    assert (q.scales.float() > 0).all()
    d = q.dequantize()
    assert torch.isfinite(d).all() and (d.abs() <= 2e-40).all()



@pytest.mark.parametrize("name", SPECS)
def test_transpose_shares_quantization_only_when_exact(name):
    """Where gemm.transpose_shares_quantization(spec) holds, Q(w^T) == Q(w)^T bit for bit (odd shape,
    non-zero offset); it holds for the 128x128 weight blocks of the fp8 and fp4 recipes."""
    spec = SPECS[name]
    w = torch.randn(200, 300, generator=torch.Generator().manual_seed(5))
    if gemm.transpose_shares_quantization(spec):
        assert _same(fake_quantize(w, spec, seed=3, offset=9, transpose=True), fake_quantize(w, spec, seed=3, offset=9).t())
    assert gemm.transpose_shares_quantization(recipe("fp8").weight)
    assert gemm.transpose_shares_quantization(recipe("fp4").weight)
    assert not gemm.transpose_shares_quantization(SPECS["fp4_128x128_sr"])
