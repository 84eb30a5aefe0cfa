"""Element casts against independent oracles (torch dtypes, ml_dtypes), exhaustively over all codes."""

import ml_dtypes
import numpy as np
import pytest
import torch

from snip_ops.cast import decode, encode, round_to_format
from snip_ops.formats import BF16, E2M1, E2M3, E3M2, E4M3, E5M2, FP16, Rounding, element_format, exmy
from snip_ops.philox import SR_BITS

# (format, numpy dtype used as oracle, torch dtype or None)
ORACLES = [
    (E4M3, ml_dtypes.float8_e4m3fn, torch.float8_e4m3fn),
    (E5M2, ml_dtypes.float8_e5m2, torch.float8_e5m2),
    (E2M1, ml_dtypes.float4_e2m1fn, None),
    (E3M2, ml_dtypes.float6_e3m2fn, None),
    (E2M3, ml_dtypes.float6_e2m3fn, None),
    (BF16, ml_dtypes.bfloat16, torch.bfloat16),
    (FP16, np.float16, torch.float16),
    (exmy(4, 3), ml_dtypes.float8_e4m3, None),   # IEEE-style E4M3 (with Inf)
    (exmy(3, 4), ml_dtypes.float8_e3m4, None),
]
IDS = [f.name for f, _, _ in ORACLES]


def _all_codes(fmt):
    return torch.arange(1 << fmt.bits, dtype=torch.int64)


def _oracle_values(codes, np_dtype, fmt):
    """Decode codes with the oracle: reinterpret the bit pattern in the numpy dtype."""
    if fmt.bits == 16:
        return torch.from_numpy(codes.numpy().astype(np.uint16).view(np_dtype).astype(np.float32))
    raw = codes.numpy().astype(np.uint8).view(np_dtype) if fmt.bits == 8 else None
    if raw is None:  # sub-byte ml_dtypes: build by value from every code via float32 round trip
        values = np.arange(-64, 64, 1 / 64, dtype=np.float32).astype(np_dtype)
        table = {int(v.view(np.uint8)) & ((1 << fmt.bits) - 1): float(v) for v in values}
        return torch.tensor([table[int(c)] for c in codes], dtype=torch.float32)
    return torch.from_numpy(raw.astype(np.float32))


def _same(a, b):
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all()) and bool(
        (torch.signbit(a[a == 0]) == torch.signbit(b[a == 0])).all()
    )


def _round_by_bits(v, fmt, rounding, words=None):
    """The cast rule written on integer bit patterns (int64), exactly as the module docstring of
    snip_ops.cast states it: the specification the float32 implementation must meet."""
    bits = v.view(torch.int32).to(torch.int64)
    mag = bits & 0x7FFFFFFF
    e_field = mag >> 23
    sig = torch.where(e_field == 0, mag & 0x7FFFFF, (mag & 0x7FFFFF) | 0x800000)
    e_ulp = torch.where(e_field == 0, torch.full_like(e_field, -149), e_field - 150)
    _, exp = torch.frexp(v)
    q = torch.clamp(exp.to(torch.int64) - 1, min=fmt.emin) - fmt.man_bits
    shift = (q - e_ulp).clamp(0, 62)
    kept = sig >> shift
    rem = sig - (kept << shift)
    if rounding == Rounding.RNE:
        half = (1 << shift) >> 1
        up = (rem > half) | ((rem == half) & (half > 0) & ((kept & 1) == 1))
    elif rounding == Rounding.TRUNC:
        up = torch.zeros_like(kept, dtype=torch.bool)
    else:
        r = SR_BITS
        top = torch.where(shift >= r, rem >> (shift - r).clamp(0, 62), rem << (r - shift).clamp(0, 62))
        up = (top + words) >= (1 << r)
    magnitude = torch.ldexp((kept + up.to(torch.int64)).double(), q.double())
    magnitude = magnitude.clamp(max=fmt.max_finite).float()
    out = torch.where(bits < 0, -magnitude, magnitude)
    out = torch.where(torch.isinf(v), v if fmt.has_inf else torch.full_like(v, float("nan")), out)
    return torch.where(torch.isnan(v), v, out)


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1, E3M2, BF16, FP16, exmy(8, 1), exmy(1, 2, "none")], ids=lambda f: f.name)
@pytest.mark.parametrize("rounding", list(Rounding), ids=lambda r: r.value)
def test_float32_cast_equals_the_integer_bit_rule(fmt, rounding):
    gen = torch.Generator().manual_seed(0)
    mags = torch.exp2(torch.empty(200000).uniform_(-150, 128, generator=gen))
    v = torch.cat([
        mags * torch.sign(torch.randn(200000, generator=gen)),
        torch.tensor([0.0, -0.0, 1e-45, -1e-40, 3.4e38, float("inf"), float("-inf"), float("nan")]),
        decode(torch.arange(min(1 << fmt.bits, 1 << 16)), fmt),
    ]).float()
    words = torch.randint(0, 2**SR_BITS, v.shape, generator=gen, dtype=torch.int64)
    assert _same(round_to_format(v, fmt, rounding, words), _round_by_bits(v, fmt, rounding, words))


@pytest.mark.parametrize("fmt,np_dtype,_", ORACLES, ids=IDS)
def test_decode_every_code_matches_oracle(fmt, np_dtype, _):
    codes = _all_codes(fmt)
    assert _same(decode(codes, fmt), _oracle_values(codes, np_dtype, fmt))


@pytest.mark.parametrize("fmt,np_dtype,_", ORACLES, ids=IDS)
def test_every_finite_code_round_trips(fmt, np_dtype, _):
    codes = _all_codes(fmt)
    values = decode(codes, fmt)
    finite = torch.isfinite(values)
    assert torch.equal(round_to_format(values[finite], fmt, Rounding.RNE), values[finite])
    assert torch.equal(encode(values[finite], fmt), codes[finite])
    nan_codes = encode(values[torch.isnan(values)], fmt)
    assert torch.isnan(decode(nan_codes, fmt)).all()


@pytest.mark.parametrize("fmt,np_dtype,torch_dtype", ORACLES, ids=IDS)
def test_rne_matches_oracle_on_midpoints_and_random(fmt, np_dtype, torch_dtype):
    values = decode(_all_codes(fmt), fmt)
    grid = torch.unique(values[torch.isfinite(values)])
    mids = (grid[:-1].double() + grid[1:].double()) / 2
    nudged = torch.cat([mids, torch.nextafter(mids.float().double(), torch.tensor(0.0, dtype=torch.float64))])
    gen = torch.Generator().manual_seed(0)
    scale = fmt.max_finite
    rand = torch.cat([torch.randn(20000, generator=gen) * s for s in (scale, scale / 100, fmt.min_normal, fmt.min_subnormal)])
    v = torch.cat([mids.float(), nudged.float(), rand]).clamp(-fmt.max_finite, fmt.max_finite)
    ours = round_to_format(v, fmt, Rounding.RNE)
    oracle = torch.from_numpy(v.numpy().astype(np_dtype).astype(np.float32))
    assert _same(ours, oracle)
    if torch_dtype is not None:
        assert _same(ours, v.to(torch_dtype).float())


def test_fp32_subnormal_inputs_round_like_bf16():
    sub = torch.tensor([1e-40, -3e-39, 1.4e-45, 5e-42], dtype=torch.float32)
    assert _same(round_to_format(sub, BF16, Rounding.RNE), sub.to(torch.bfloat16).float())


@pytest.mark.parametrize("fmt", [E4M3, E5M2, E2M1, E3M2, BF16], ids=lambda f: f.name)
@pytest.mark.parametrize("rounding", list(Rounding), ids=lambda r: r.value)
def test_saturation_and_non_finite(fmt, rounding):
    over = min(fmt.max_finite * 1.01, 3.4e38)  # stays finite in float32
    big = torch.tensor([over, -min(fmt.max_finite * 4, 3.4e38), 3.4e38, float("inf"), float("-inf"), float("nan")])
    words = torch.full(big.shape, 0xFFFFFFFF, dtype=torch.int64)
    out = round_to_format(big, fmt, rounding, words)
    assert out[:3].tolist() == [fmt.max_finite, -fmt.max_finite, fmt.max_finite]
    if fmt.has_inf:
        assert out[3] == float("inf") and out[4] == float("-inf")
    else:
        assert torch.isnan(out[3:5]).all()
    assert torch.isnan(out[5])


def test_truncation_is_toward_zero():
    v = torch.tensor([1.9, -1.9, 0.3, -5.9, 1e-3])
    assert round_to_format(v, E2M1, Rounding.TRUNC).tolist() == [1.5, -1.5, 0.0, -4.0, 0.0]


def test_negative_zero_keeps_its_sign():
    z = torch.tensor([-0.0, -1e-30])
    out = round_to_format(z, E4M3, Rounding.RNE)
    assert torch.signbit(out).all() and (out == 0).all()
    assert encode(out, E4M3).tolist() == [0x80, 0x80]


def test_element_format_names():
    assert element_format("e4m3") is E4M3
    assert element_format("e8m7") is BF16
    assert element_format("e8m3").man_bits == 3
    assert element_format("e3m2_ieee").special == "ieee"
    with pytest.raises(ValueError, match="unknown element format"):
        element_format("float9")
    with pytest.raises(ValueError, match="exponent bits"):
        exmy(9, 2)
    with pytest.raises(TypeError, match="float32"):
        round_to_format(torch.ones(2, dtype=torch.float64), E4M3, Rounding.RNE)
    with pytest.raises(ValueError, match="random value"):
        round_to_format(torch.ones(2), E4M3, Rounding.SR)
