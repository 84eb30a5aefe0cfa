"""A fast CPU stand-in for `snip_ops.reference.fake_quantize`, used only by bench/bench_planner.py.

Why: the reference quantizer works on int64 bit patterns and draws SR bits from an int64 Philox. When
the plan-quality and validity runs were made, one emulated training step of the tiny model under a
75%-FP4 plan took ~5 s with it and ~1.2 s with this stand-in (1 thread, shared 2-core machine); the
reference has since become faster (bench/results/cpu-planner-cost.json: 1.46 s vs 1.07 s at batch
8 x 128). The stand-in computes the same values with float32 arithmetic on a blocked view:

* block scales exactly as the reference (`amax / max_finite`, all-zero block -> 1, FP32 or POW2);
* E4M3 round-to-nearest-even through torch's native float8_e4m3fn cast (after clamping to +-448,
  which is the reference's saturation);
* E2M1 round-to-nearest-even as `round(|v| / q) * q` with the E2M1 quantum q (0.5 below 2, 1 below
  4, 2 above; torch.round is half-to-even), saturated at 6;
* E2M1 stochastic rounding as `floor(|v| / q + u) * q`, u uniform from torch's generator keyed by
  (seed, offset): the same distribution as the reference's Philox SR, not the same bits.

`verify()` checks the RNE paths bit for bit against the reference and SR for unbiasedness; every
other spec (MX / NVFP4 scales, E4M3 SR, simulated eXmY) falls through to the reference unchanged.
"""

from __future__ import annotations

import contextlib

import torch

from snip_ops import gemm, reference
from snip_ops.formats import E2M1, E4M3, QuantSpec, Rounding, ScaleKind

__all__ = ["fast_fake_quantize", "installed", "verify"]


def _handled(spec: QuantSpec, tensor_amax) -> bool:
    if tensor_amax is not None or spec.scale not in (ScaleKind.FP32, ScaleKind.POW2):
        return False
    if spec.element == E4M3:
        return spec.rounding == Rounding.RNE
    return spec.element == E2M1 and spec.rounding in (Rounding.RNE, Rounding.SR)


def _round_e2m1(v: torch.Tensor, stochastic: bool, seed: int, offset: int) -> torch.Tensor:
    a = v.abs().clamp(max=6.0)
    q = torch.where(a < 2.0, 0.5, torch.where(a < 4.0, 1.0, 2.0))
    if stochastic:
        gen = torch.Generator(device=v.device).manual_seed((seed * 1_000_003 + offset) % 2**63)
        r = torch.floor(a / q + torch.rand(a.shape, generator=gen, device=v.device)) * q
    else:
        r = torch.round(a / q) * q
    return torch.copysign(r.clamp(max=6.0), v)


def fast_fake_quantize(x, spec, *, seed=0, offset=0, transpose=False, tensor_amax=None):
    """Same signature and (for RNE) the same values as `reference.fake_quantize`."""
    if not _handled(spec, tensor_amax):
        return reference.fake_quantize(x, spec, seed=seed, offset=offset, transpose=transpose,
                                       tensor_amax=tensor_amax)
    reference.check_input(x)
    xf = x.float()
    if transpose:
        xf = xf.t()
    rows, cols = xf.shape
    br, bc = reference.block_shape(spec, (rows, cols))
    xp = reference._pad(xf, br, bc)
    # Blocks as a 4-D view, scales broadcast over it (no expanded scale tensor).
    blocks = xp.reshape(xp.shape[0] // br, br, xp.shape[1] // bc, bc)
    amax = blocks.abs().amax(dim=(1, 3), keepdim=True)
    _, s = reference.block_scales(amax, spec, None)
    v = blocks / s
    if spec.element == E4M3:
        y = v.clamp(-E4M3.max_finite, E4M3.max_finite).to(torch.float8_e4m3fn).float()
    else:
        y = _round_e2m1(v, spec.rounding == Rounding.SR, seed, offset)
    y = torch.where(torch.isfinite(s), y, 0.0) * s  # a non-finite block stays non-finite (as the reference)
    return y.reshape(xp.shape)[:rows, :cols]


@contextlib.contextmanager
def installed():
    """Route `snip_ops.gemm` (hence SnipLinear and the planner's error estimates) through the stand-in."""
    original = gemm.fake_quantize
    gemm.fake_quantize = fast_fake_quantize
    try:
        yield
    finally:
        gemm.fake_quantize = original


def verify(seed: int = 0) -> dict:
    """Bit-exactness of the RNE paths against the reference; mean bias of SR. Raises on mismatch."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 384, generator=g) * torch.logspace(-6, 3, 384)  # many magnitudes per block
    x[3] = 0.0  # an all-zero row (scale 1)
    checked = 0
    for elem in (E4M3, E2M1):
        for block in ((1, 128), (128, 128)):
            for scale in (ScaleKind.FP32, ScaleKind.POW2):
                for transpose in (False, True):
                    spec = QuantSpec(elem, block, scale, Rounding.RNE)
                    ref = reference.fake_quantize(x, spec, transpose=transpose)
                    fast = fast_fake_quantize(x, spec, transpose=transpose)
                    if not torch.equal(ref, fast):
                        bad = (ref != fast).sum().item()
                        raise AssertionError(f"fast quantizer differs from the reference for {spec.describe()} "
                                             f"transpose={transpose}: {bad} elements")
                    checked += 1
    spec = QuantSpec(E2M1, (1, 128), ScaleKind.FP32, Rounding.SR)
    xs = torch.rand(64, 128, generator=g) * 5.0
    xs[:, 0] = 6.0  # pin the block amax so that the scale is exactly 1
    mean = torch.stack([fast_fake_quantize(xs, spec, seed=1, offset=i) for i in range(400)]).mean(0)
    # Per element the 400-draw mean has a standard error <= 1/sqrt(400) of a quantum (<= 2): check
    # the signed bias averaged over all 8192 elements, whose standard error is ~0.001.
    bias = float((mean - xs).mean())
    if abs(bias) > 0.01:
        raise AssertionError(f"stochastic rounding looks biased: mean(E[SR(x)] - x) = {bias}")
    return {"rne_specs_bit_exact": checked, "sr_mean_bias_400_draws": bias}
