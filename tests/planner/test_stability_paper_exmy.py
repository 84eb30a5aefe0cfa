"""The stability paper's eXmY simulation (planner.stability.exmy.paper_scheme): masking of mantissa bits,
exponent range clipped, no scaling, bit for bit against an oracle written in NumPy on FP32 bit patterns, for
E8M7..E8M1, E7My and E6My -- through the cast and through the simulated GEMM."""

import ml_dtypes
import numpy as np
import pytest
import torch

from planner.stability.exmy import PAPER_ROUNDING, PAPER_SCALING, paper_scheme, parse_scheme
from snip_ops import SnipLinear
from snip_ops.cast import round_to_format
from snip_ops.formats import Rounding, ScaleKind

FORMATS = [(8, m) for m in range(7, 0, -1)] + [(7, m) for m in (5, 3, 2, 1)] + [(6, m) for m in (5, 3, 2, 1)]
SIGN = np.uint32(0x80000000)


def paper_oracle(x: np.ndarray, exp_bits: int, man_bits: int) -> np.ndarray:
    """float32 x -> E<exp_bits>M<man_bits> as the paper simulates it, computed on the FP32 bit patterns.

    Normal range of the target: clear the 23 - man_bits low mantissa bits. Above the largest finite value:
    that value (clipped). Below the smallest normal 2^emin: the largest multiple of 2^(emin - man_bits) not
    above |x| (truncation onto the subnormal grid), by integer division of the magnitude in units of FP32's
    smallest subnormal 2^-149 (every finite float32 is an integer number of them). Sign bit kept; Inf and
    NaN pass through."""
    bias = (1 << (exp_bits - 1)) - 1
    emin, emax = 1 - bias, (1 << exp_bits) - 2 - bias
    bits = x.view(np.uint32)
    sign, magnitude = bits & SIGN, bits & ~SIGN
    masked = magnitude & ~np.uint32((1 << (23 - man_bits)) - 1)
    # the target's subnormal quantum 2^(emin - man_bits) in units of 2^-149 (>= 1 for every format here)
    quantum = 1 << (emin - man_bits + 149)
    finite = magnitude < np.uint32(0x7F800000)
    # exact: a power-of-two shift in float64 (Inf and NaN, handled last, read as 0 here)
    in_units = np.where(finite, magnitude.view(np.float32), 0).astype(np.float64) * 2.0**149
    subnormal = ((in_units // quantum) * quantum * 2.0**-149).astype(np.float32).view(np.uint32)
    min_normal = np.uint32((emin + 127) << 23) if emin > -126 else np.uint32(1 << 23)
    max_finite = np.float32((2 - 2.0**-man_bits) * 2.0**emax).view(np.uint32)
    out = np.where(magnitude < min_normal, subnormal, masked)
    out = np.where(magnitude > max_finite, max_finite, out)
    out = np.where(finite, out, magnitude)  # Inf, NaN
    return (out | sign).view(np.float32)


def _all_exponents(n=1 << 14, seed=0) -> np.ndarray:
    """Random finite float32 bit patterns: every exponent (subnormals included), both signs."""
    bits = np.random.default_rng(seed).integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)
    return bits[(bits & np.uint32(0x7F800000)) != np.uint32(0x7F800000)].view(np.float32)


def _edges(exp_bits: int, man_bits: int) -> np.ndarray:
    """Values at and next to the target's range limits, FP32's limits, zeros."""
    bias = (1 << (exp_bits - 1)) - 1
    emin, emax = 1 - bias, (1 << exp_bits) - 2 - bias
    points = [(2 - 2.0**-man_bits) * 2.0**emax, 2.0**emin, 2.0 ** (emin - man_bits), 2.0 ** (emin - man_bits - 1),
              2.0**-126, 2.0**-149, float(np.finfo(np.float32).max), 1.0, 0.0]
    values = np.array(points, dtype=np.float32)
    with np.errstate(over="ignore"):  # above FP32's largest value: Inf, dropped
        values = np.concatenate([values, np.nextafter(values, np.float32(np.inf)), np.nextafter(values, np.float32(0))])
    values = values[np.isfinite(values)]
    return np.concatenate([values, -values])


@pytest.mark.parametrize("exp_bits,man_bits", FORMATS)
def test_cast_equals_the_bit_masking_oracle(exp_bits, man_bits):
    scheme = paper_scheme(exp_bits, man_bits)
    spec = scheme.spec()
    assert spec.rounding == Rounding.TRUNC and spec.scale == ScaleKind.NONE and spec.element.special == "ieee"
    x = np.concatenate([_all_exponents(seed=exp_bits * 8 + man_bits), _edges(exp_bits, man_bits),
                        np.array([np.inf, -np.inf, np.nan], dtype=np.float32)])
    got = round_to_format(torch.from_numpy(x.copy()), spec.element, spec.rounding).numpy()
    expected = paper_oracle(x, exp_bits, man_bits)
    finite = np.isfinite(x)
    assert np.array_equal(got[finite].view(np.uint32), expected[finite].view(np.uint32))  # -0 included
    assert np.array_equal(got[np.isinf(x)], x[np.isinf(x)]) and np.isnan(got[np.isnan(x)]).all()


@pytest.mark.parametrize("exp_bits,man_bits", FORMATS)
def test_simulated_gemm_operand_equals_the_oracle(exp_bits, man_bits):
    """fprop y = Q(x) I^T with an exact identity weight: the output is the simulated activation cast."""
    x = np.concatenate([_all_exponents(n=4096, seed=man_bits), _edges(exp_bits, man_bits)])
    x = x[np.abs(x) < 2.0**100]  # products with the identity's zeros and their sums stay exact in FP32
    x = np.resize(x, (len(x) // 64, 64)).astype(np.float32)
    lin = SnipLinear(64, 64, bias=False, precision=paper_scheme(exp_bits, man_bits, operands=("act",)).precision())
    with torch.no_grad():
        lin.weight.copy_(torch.eye(64))
        y = lin(torch.from_numpy(x)).numpy()
    expected = paper_oracle(x, exp_bits, man_bits)
    assert np.array_equal(y, expected)  # compares values: the GEMM turns -0 into +0


def test_e8m7_is_the_bfloat16_grid_and_e8_keeps_the_fp32_range():
    x = _all_exponents(seed=1)
    y = paper_oracle(x, 8, 7)
    # independent check of the oracle: E8M7 truncation lands on bfloat16 values (ml_dtypes), toward zero, less
    # than one bfloat16 quantum away: 2^(exponent - 7) <= |x| 2^-7, or 2^-133 on the subnormal grid
    assert np.array_equal(y.astype(ml_dtypes.bfloat16).astype(np.float32).view(np.uint32), y.view(np.uint32))
    gap = np.abs(x).astype(np.float64) - np.abs(y).astype(np.float64)
    assert np.all(gap >= 0) and np.all(gap < np.maximum(np.abs(x).astype(np.float64) * 2.0**-7, 2.0**-133))
    # E8: nothing finite is clipped or flushed beyond FP32's own subnormal grid
    assert float(np.max(np.abs(paper_oracle(np.array([3.0e38], np.float32), 8, 1)))) > 1e38


def test_exponent_clipping_saturates_and_underflows():
    for exp_bits, man_bits in [(7, 2), (6, 2), (6, 5)]:
        spec = paper_scheme(exp_bits, man_bits).spec()
        fmt = spec.element
        big = torch.tensor([fmt.max_finite * 4, -fmt.max_finite * 4, 3.0e38])
        assert round_to_format(big, fmt, spec.rounding).tolist() == [fmt.max_finite, -fmt.max_finite, fmt.max_finite]
        small = torch.tensor([fmt.min_subnormal * 0.75, fmt.min_subnormal * 1.75, -fmt.min_normal * 0.99])
        got = round_to_format(small, fmt, spec.rounding)
        assert got.tolist() == [0.0, fmt.min_subnormal, -(fmt.min_normal - fmt.min_subnormal)]
    assert paper_scheme(6, 2).element.min_normal == 2.0**-30 and paper_scheme(7, 2).element.min_normal == 2.0**-62


def test_paper_option_and_constructor_agree():
    assert (PAPER_ROUNDING, PAPER_SCALING) == (Rounding.TRUNC, None)
    assert parse_scheme("e7m2:paper") == paper_scheme(7, 2) == parse_scheme("e7m2:trunc")
    assert paper_scheme(8, 3).label == "e8m3:trunc" and parse_scheme(paper_scheme(6, 2).label) == paper_scheme(6, 2)
    assert parse_scheme("e8m1:paper:ops=grad").operands == ("grad",)
    for bad in ("e7m2:paper:rne", "e7m2:paper:tensor", "e7m2:1x32:paper", "e7m2:paper:paper"):
        with pytest.raises(ValueError):
            parse_scheme(bad)
