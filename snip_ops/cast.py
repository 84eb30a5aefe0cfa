"""Element casts: FP32 values -> values of an `ElementFormat` -> codes, and back.

This is the reference definition every kernel reproduces bit for bit. A finite FP32 value
`|v| = M * 2^E_ulp` (M the 24-bit significand, or 23 bits for FP32 subnormals) is kept to the
quantum `2^Q`, `Q = max(floor(log2|v|), emin) - man_bits`, by dropping `d = Q - E_ulp` low bits of M:

* RNE:   round half to even on the dropped bits;
* TRUNC: drop them (toward zero);
* SR:    the element's R = `philox.SR_BITS` = 16 random bits are added just below the kept LSB --
         i.e. to the top R dropped bits -- and the carry, if any, rounds away from zero. Dropped
         bits below those R are truncated. R is the same for every format.

Results above `max_finite` saturate to it (all modes). NaN stays NaN; +-Inf stays +-Inf in formats
with Inf and becomes NaN otherwise (formats without NaN have no code for either: callers that
encode must handle non-finite blocks, as `quantize` does through the scale).
"""

from __future__ import annotations

import torch

from .formats import ElementFormat, Rounding
from .philox import SR_BITS

__all__ = ["round_to_format", "encode", "decode"]

_EXPONENT_FIELD = 0x7F800000


def round_to_format(
    v: torch.Tensor, fmt: ElementFormat, rounding: Rounding, rand: torch.Tensor | None = None
) -> torch.Tensor:
    """Round float32 `v` to the nearest values of `fmt` (as float32) under `rounding`.

    `rand` holds each element's SR_BITS-bit random value (int64 in [0, 2^16), same shape, from
    `philox.element_bits` / `random_bits`) and is required for SR.

    Computed in float32 without leaving the value domain: the quantum `q = 2^Q` comes from v's
    exponent field (FP32 subnormals and zeros read as 0 and take the quantum of 2^emin), so
    `t = |v| / q` is exact -- its integer part is the kept significand, its fraction the dropped
    bits -- and the rounding rule acts on `t`. `floor(frac(t) * 2^R)` is exactly the top R dropped
    bits, so SR is the integer rule of the module docstring (tests/ops/test_cast.py checks it against an
    int64 bit-manipulation oracle). Needs gradual underflow (PyTorch's default; not
    `torch.set_flush_denormal(True)`).
    """
    if v.dtype != torch.float32:
        raise TypeError(f"round_to_format expects float32 values, got {v.dtype}")
    rounding = Rounding(rounding)
    if rounding == Rounding.SR and (rand is None or rand.shape != v.shape):
        raise ValueError("stochastic rounding needs one random value per element")

    # Inf/NaN give q = Inf, hence t = NaN, which stays NaN to the end (Inf is restored below).
    pow2_floor = (v.view(torch.int32) & _EXPONENT_FIELD).view(torch.float32)
    q = pow2_floor.clamp(min=fmt.min_normal) * 2.0 ** -fmt.man_bits
    t = v.abs() / q
    if rounding == Rounding.RNE:
        k = torch.round(t)  # half to even
    elif rounding == Rounding.TRUNC:
        k = torch.floor(t)
    else:
        k = torch.floor(t)
        top = torch.floor((t - k) * float(1 << SR_BITS))
        k = k + ((top + rand.to(torch.float32)) >= float(1 << SR_BITS)).to(torch.float32)
    out = torch.copysign((k * q).clamp(max=fmt.max_finite), v)
    if fmt.has_inf:
        out = torch.where(torch.isinf(v), v, out)
    return out


def encode(y: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """Codes (int64 bit patterns, sign at bit `fmt.bits - 1`) of values `y` already on `fmt`'s grid."""
    m, width = fmt.man_bits, fmt.exp_bits + fmt.man_bits
    sign = (y.view(torch.int32) < 0).to(torch.int64) << width
    a = y.abs().to(torch.float64)
    _, exp = torch.frexp(a)
    e = (exp.to(torch.int64) - 1).clamp(min=fmt.emin)
    normal = a >= fmt.min_normal
    exp_field = torch.where(normal, e + fmt.bias, torch.zeros_like(e))
    mant = torch.where(
        normal,
        torch.ldexp(a, (m - e).to(torch.float64)) - (1 << m),
        torch.ldexp(a, torch.full_like(a, float(m - fmt.emin))),
    ).round().to(torch.int64)
    code = sign | (exp_field << m) | mant
    top = (1 << fmt.exp_bits) - 1
    if fmt.special == "fn":
        nan_code = (1 << width) - 1
    else:
        nan_code = (top << m) | (1 << max(m - 1, 0))
    code = torch.where(torch.isnan(y), sign | nan_code, code)
    if fmt.has_inf:
        code = torch.where(torch.isinf(y), sign | (top << m), code)
    return code


def decode(codes: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """Float32 values of integer codes of `fmt` (the inverse of `encode`)."""
    c = codes.to(torch.int64)
    m, width = fmt.man_bits, fmt.exp_bits + fmt.man_bits
    sign = (c >> width) & 1
    exp_field = (c >> m) & ((1 << fmt.exp_bits) - 1)
    mant = c & ((1 << m) - 1)
    sub = exp_field == 0
    scale_exp = torch.where(sub, torch.full_like(exp_field, fmt.emin), exp_field - fmt.bias) - m
    sig = torch.where(sub, mant, mant | (1 << m))
    a = torch.ldexp(sig.to(torch.float64), scale_exp.to(torch.float64))
    top = (1 << fmt.exp_bits) - 1
    if fmt.special == "ieee":
        a = torch.where((exp_field == top) & (mant == 0), torch.full_like(a, float("inf")), a)
        a = torch.where((exp_field == top) & (mant != 0), torch.full_like(a, float("nan")), a)
    elif fmt.special == "fn":
        a = torch.where((c & ((1 << width) - 1)) == (1 << width) - 1, torch.full_like(a, float("nan")), a)
    a = a.to(torch.float32)
    return torch.where(sign == 1, -a, a)
