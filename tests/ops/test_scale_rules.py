"""Block-scale rules over the whole float32 amax range, subnormals included (docs/design.md §1).

POW2 and E8M0 scales are the smallest power of two >= amax / max_finite (IEEE float32 division), over
the range the scale type represents: float32's 2^-149..2^127 for POW2, E8M0's 2^-127..2^127 (code 0 is
2^-127, as in OCP MX). The oracle here is independent of both implementations: numpy's float32
division and frexp. It checks the PyTorch reference and the quantizer kernels' own arithmetic
(csrc/quant/quant_math.cuh, compiled for the host) on every subnormal amax and a dense sample of
normal ones. NVFP4's scales (E4M3 block scale times the FP32 tensor scale) are checked kernel against
reference on the same amax values, for tensor scales from normal to subnormal.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import host_twin
from snip_ops import quantize, reference
from snip_ops.formats import E2M1, E4M3, E5M2, QuantSpec, ScaleKind

FORMATS = {"e4m3": E4M3, "e5m2": E5M2, "e2m1": E2M1}
KINDS = {"fp32": ScaleKind.FP32, "pow2": ScaleKind.POW2, "e8m0": ScaleKind.E8M0}
INF_BITS, NAN_BITS = 0x7F800000, 0x7FC00000


def _amax_bits() -> np.ndarray:
    """Every subnormal pattern, every 997th normal pattern, the largest finite, 0, Inf and NaN."""
    subnormal = np.arange(1, 1 << 23, dtype=np.uint32)
    normal = np.arange(1 << 23, INF_BITS, 997, dtype=np.uint32)
    return np.concatenate([subnormal, normal, np.array([0x7F7FFFFF, 0, INF_BITS, NAN_BITS], np.uint32)])


def _expected(amax_bits: np.ndarray, kind: str, max_finite: float) -> tuple[np.ndarray, np.ndarray]:
    """(element scale, stored bits) by the rule, from numpy alone."""
    amax = amax_bits.view(np.float32)
    with np.errstate(invalid="ignore"):
        q = amax / np.float32(max_finite)
    q = np.where((q == 0) & (amax > 0), np.float32(2.0**-149), q)
    if kind != "fp32":
        mant, exp = np.frexp(q.astype(np.float64))
        q = np.where(mant == 0.5, q.astype(np.float64), np.ldexp(1.0, exp)).astype(np.float32)
    if kind == "e8m0":
        q = np.maximum(q, np.float32(2.0**-127))
    q = np.where(amax == 0, np.float32(1.0), q)
    q = np.where(np.isfinite(amax), q, np.float32("nan")).astype(np.float32)
    if kind != "e8m0":
        return q, q.view(np.uint32)
    _, exp = np.frexp(q.astype(np.float64))  # q = 2^(exp - 1); E8M0 code = exponent + 127, NaN 0xFF
    code = np.where(np.isnan(q), 0xFF, exp - 1 + 127)
    return q, code.astype(np.uint32)


def _same_floats(got: np.ndarray, want: np.ndarray) -> bool:
    """Bit-identical, any NaN matching any NaN."""
    g, w = got.view(np.uint32), want.view(np.uint32)
    nan = np.isnan(want)
    return bool(np.array_equal(np.isnan(got), nan) and np.array_equal(g[~nan], w[~nan]))


@pytest.fixture(scope="module")
def amax_bits():
    return _amax_bits()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("elem", FORMATS)
def test_reference_scales_follow_the_rule(amax_bits, kind, elem):
    fmt = FORMATS[elem]
    want_s, want_stored = _expected(amax_bits, kind, fmt.max_finite)
    amax = torch.from_numpy(amax_bits.view(np.int32).copy()).view(torch.float32)
    stored, s = reference.block_scales(amax, QuantSpec(fmt, (1, 32), KINDS[kind]), None)
    assert _same_floats(s.numpy(), want_s)
    if kind == "e8m0":
        assert np.array_equal(stored.view(torch.uint8).numpy().astype(np.uint32), want_stored)
    else:
        assert _same_floats(stored.numpy(), want_s)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("elem", FORMATS)
def test_kernel_scales_follow_the_rule(amax_bits, kind, elem):
    want_s, want_stored = _expected(amax_bits, kind, FORMATS[elem].max_finite)
    # the kernels see NaN as Inf (block max over integer bit patterns: see block_scale's comment)
    bits = np.where(amax_bits > INF_BITS, INF_BITS, amax_bits).astype(np.uint32)
    s, stored = host_twin.block_scales(host_twin.load(), bits, kind, elem)
    assert _same_floats(s, want_s)
    if kind == "e8m0":
        assert np.array_equal(stored, want_stored)
    else:
        assert _same_floats(stored.view(np.float32), want_s)


@pytest.mark.parametrize("tensor_amax", [1.0, 2688.0, 3e38, 1e-30, 2.0**-140, 0.0])
def test_kernel_nvfp4_scales_are_the_reference(amax_bits, tensor_amax):
    """NVFP4 (E4M3 block scale times an FP32 tensor scale) has no closed form to check against: the
    kernels' arithmetic must equal the reference's, bit for bit, tensor scale included."""
    lib = host_twin.load()
    t_ref = reference._nvfp4_tensor_scale(torch.tensor(tensor_amax, dtype=torch.float32))
    t_kernel = host_twin.nvfp4_tensor_scales(lib, np.array([np.float32(tensor_amax).view(np.uint32)], np.uint32))
    assert _same_floats(t_kernel, t_ref.reshape(1).numpy())
    amax = torch.from_numpy(amax_bits.view(np.int32).copy()).view(torch.float32)
    stored, s = reference.block_scales(amax, QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4), t_ref)
    bits = np.where(amax_bits > INF_BITS, INF_BITS, amax_bits).astype(np.uint32)
    s_kernel, stored_kernel = host_twin.block_scales(lib, bits, "nvfp4", "e2m1", float(t_ref))
    assert _same_floats(s_kernel, s.numpy())
    assert np.array_equal(stored_kernel, stored.view(torch.uint8).numpy().astype(np.uint32))


def test_kernel_nvfp4_tensor_scales_are_the_reference(amax_bits):
    amax = torch.from_numpy(amax_bits.view(np.int32).copy()).view(torch.float32)
    assert _same_floats(host_twin.nvfp4_tensor_scales(host_twin.load(), amax_bits),
                        reference._nvfp4_tensor_scale(amax).numpy())


def test_e8m0_scale_of_a_subnormal_block_is_the_next_power_of_two():
    """The case that used to give 2^-126: 2.5e-39 / 6 lies in (2^-131, 2^-130], below E8M0's 2^-127."""
    q = quantize(torch.tensor([[2.5e-39]]), QuantSpec.parse("e2m1/1x32/e8m0/rne"))
    assert q.scales.view(torch.uint8).item() == 0 and q.scales.float().item() == 2.0**-127
    q = quantize(torch.tensor([[2.5e-39]]), QuantSpec.parse("e2m1/1x32/pow2/rne"))
    assert q.scales.item() == 2.0**-130
    assert q.dequantize().item() == 3.0 * 2.0**-130  # 2.5e-39 / 2^-130 = 3.40 -> E2M1 3
