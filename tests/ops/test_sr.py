"""Stochastic rounding: exact unbiasedness over the whole 16-bit random space, neighbours only,
determinism and stream separation."""

import math

import pytest
import torch

from snip_ops.cast import round_to_format
from snip_ops.formats import BF16, E2M1, E4M3, E5M2, Rounding, exmy
from snip_ops.reference import quantize
from snip_ops.formats import QuantSpec, ScaleKind
from snip_ops.philox import SR_BITS

FORMATS = [E4M3, E5M2, E2M1, BF16, exmy(3, 2)]


def _all_values() -> torch.Tensor:
    return torch.arange(1 << SR_BITS, dtype=torch.int64)


def _inputs(fmt, n=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lo, hi = math.log2(fmt.min_normal), math.log2(fmt.max_finite)
    normal = torch.exp2(torch.empty(n).uniform_(lo, hi, generator=gen)) * torch.sign(torch.randn(n, generator=gen))
    # values whose dropped part fits in 16 bits (they sit on a 2^-16-of-a-quantum grid)
    quantum = 2.0 ** (torch.floor(torch.log2(normal.abs())).clamp(min=fmt.emin) - fmt.man_bits)
    normal = torch.round(normal / quantum * 2**SR_BITS) * quantum * 2.0**-SR_BITS
    sub_q = fmt.min_subnormal
    sub = torch.tensor([sub_q * 0.25, sub_q * 1.75, -sub_q * 0.5 + sub_q * 2.0**-SR_BITS])
    return torch.cat([normal, sub]).float()


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_sr_over_the_whole_random_bit_space(fmt):
    """Enumerating all 2^16 random values: E[SR(x)] == x exactly where the dropped part fits in 16
    bits, results are the two neighbours of x, and x rounds up with probability (x - down) / (up - down)."""
    words = _all_values()
    for v in _inputs(fmt).tolist():
        x = torch.full(words.shape, v, dtype=torch.float32)
        out = round_to_format(x, fmt, Rounding.SR, words)
        assert out.double().sum().item() / words.numel() == v
        down = round_to_format(x[:1], fmt, Rounding.TRUNC).item()
        values = torch.unique(out).tolist()
        assert len(values) <= 2 and down in values
        if len(values) == 2:
            up = values[0] if values[1] == down else values[1]
            p_up = (out == up).double().mean().item()
            assert p_up == (v - down) / (up - down)


def test_sr_exact_values_never_move():
    words = torch.randint(0, 2**SR_BITS, (256,), dtype=torch.int64)
    for fmt in FORMATS:
        grid = torch.tensor([0.0, -0.0, fmt.min_subnormal, -fmt.min_normal, fmt.max_finite, 1.0]).float()
        x = grid.repeat(256 // 6 + 1)[:256]
        assert torch.equal(round_to_format(x, fmt, Rounding.SR, words), x)


def test_sr_saturates_like_rne():
    words = torch.full((2,), 2**SR_BITS - 1, dtype=torch.int64)
    out = round_to_format(torch.tensor([447.9, -448.0]), E4M3, Rounding.SR, words)
    assert out.tolist() == [448.0, -448.0]


def test_sr_deep_subnormal_truncates_below_r_bits():
    # Far below the smallest subnormal the dropped part is longer than 16 bits: probability is kept to 2^-16.
    fmt = E4M3
    words = _all_values()
    tiny = fmt.min_subnormal * 2.0 ** -(SR_BITS + 2)
    out = round_to_format(torch.full(words.shape, tiny, dtype=torch.float32), fmt, Rounding.SR, words)
    assert (out == 0).all()


def test_quantize_sr_determinism_and_offsets():
    x = torch.randn(33, 200)
    spec = QuantSpec(E2M1, (1, 32), ScaleKind.E8M0, Rounding.SR)
    a = quantize(x, spec, seed=5, offset=9)
    assert torch.equal(a.codes, quantize(x, spec, seed=5, offset=9).codes)
    b = quantize(x, spec, seed=5, offset=10)
    c = quantize(x, spec, seed=6, offset=9)
    assert not torch.equal(a.codes, b.codes) and not torch.equal(a.codes, c.codes)
    assert torch.equal(a.scales.view(torch.uint8), b.scales.view(torch.uint8))


def test_quantize_sr_is_unbiased_statistically():
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    spec = QuantSpec(E2M1, (1, 128), ScaleKind.FP32, Rounding.SR)
    draws = 200
    mean = torch.stack([quantize(x, spec, seed=0, offset=k).dequantize() for k in range(draws)]).double().mean(0)
    # Each draw is one of x's two neighbours on the block's grid s * {0, .5, 1, 1.5, 2, 3, 4, 6}: the
    # one toward zero (truncation) and the one a spacing further out, taken with probability p. So the
    # mean of the draws has standard deviation sd = sqrt(p (1 - p) / draws) * spacing, E|mean - x| <= sd,
    # and the average of |mean - x| over the n elements stays below mean(sd) + 6 sqrt(sum sd^2) / n.
    trunc = quantize(x, spec.with_rounding(Rounding.TRUNC))
    s = trunc.scales.double()
    low = trunc.dequantize().double().abs() / s
    spacing = torch.where(low < 2, 0.5, torch.where(low < 4, 1.0, 2.0)) * s
    p = ((x.double().abs() - low * s) / spacing).clamp(0, 1)  # x on the grid: p ~ 0 up to rounding
    sd = (p * (1 - p) / draws).sqrt() * spacing
    bound = sd.mean() + 6 * sd.pow(2).sum().sqrt() / x.numel()
    assert (mean - x.double()).abs().mean() < bound
    # biased rounding fails it: round-to-nearest errs by ~spacing / 4 on average
    rne_err = (quantize(x, spec.with_rounding("rne")).dequantize().double() - x.double()).abs().mean()
    assert rne_err > 5 * bound
