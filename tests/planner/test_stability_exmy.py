"""eXmY simulation (planner.stability.exmy): casts equal independent oracles (ml_dtypes, torch dtypes)
through the whole simulated GEMM path; truncation, SR, range clamping and operand selection."""

import ml_dtypes
import numpy as np
import pytest
import torch

from bounds import assert_within_gemm_bound
from planner.stability.exmy import BIT_REDUCTION_LADDER, Scheme, exmy_precision, parse_scheme
from snip_ops import SnipLinear
from snip_ops.formats import GEMMS, Rounding, ScaleKind, element_format

# scheme name -> (numpy dtype, torch dtype) casting float32 with RNE
ORACLES = {
    "e8m7": (ml_dtypes.bfloat16, torch.bfloat16),
    "e5m10": (np.float16, torch.float16),
    "e5m2": (ml_dtypes.float8_e5m2, torch.float8_e5m2),
    "e4m3": (ml_dtypes.float8_e4m3fn, torch.float8_e4m3fn),
    "e4m3_ieee": (ml_dtypes.float8_e4m3, None),
    "e3m4": (ml_dtypes.float8_e3m4, None),
    "e3m2": (ml_dtypes.float6_e3m2fn, None),
    "e2m3": (ml_dtypes.float6_e2m3fn, None),
    "e2m1": (ml_dtypes.float4_e2m1fn, None),
}


def _identity_layer(scheme: Scheme, k: int) -> SnipLinear:
    """fprop y = Q(x) I^T: with an exact identity weight the output is the simulated activation cast."""
    lin = SnipLinear(k, k, bias=False, precision=scheme.precision())
    with torch.no_grad():
        lin.weight.copy_(torch.eye(k))
    return lin


def _values_in_range(fmt, n=4096, seed=0):
    gen = torch.Generator().manual_seed(seed)
    lo, hi = np.log2(fmt.min_subnormal) - 2, np.log2(fmt.max_finite)
    mags = torch.exp2(torch.empty(n).uniform_(float(lo), float(hi), generator=gen))
    return (mags * torch.sign(torch.randn(n, generator=gen))).float().reshape(-1, 64)


@pytest.mark.parametrize("name", list(ORACLES))
def test_simulated_activation_cast_equals_oracle_dtypes(name):
    scheme = Scheme(element_format(name), operands=("act",), gemms=("fprop",))
    x = _values_in_range(scheme.element)
    y = _identity_layer(scheme, 64)(x).detach()
    np_dtype, torch_dtype = ORACLES[name]
    assert torch.equal(y, torch.from_numpy(x.numpy().astype(np_dtype).astype(np.float32)))
    if torch_dtype is not None:
        assert torch.equal(y, x.to(torch_dtype).float())


def test_ladder_names_parse_and_keep_fp32_range_for_e8():
    for name in BIT_REDUCTION_LADDER:
        scheme = parse_scheme(name)
        assert scheme.label == name and parse_scheme(scheme.label) == scheme
    tiny = torch.full((1, 8), 1e-30)
    e8m1 = _identity_layer(Scheme(element_format("e8m1"), operands=("act",)), 8)(tiny)
    e5m2 = _identity_layer(Scheme(element_format("e5m2"), operands=("act",)), 8)(tiny)
    assert (e8m1 != 0).all() and (e5m2 == 0).all()  # E5 flushes what E8 keeps: the exponent range matters


@pytest.mark.parametrize("name", ["e4m3", "e5m2", "e3m2", "e2m1", "e8m1"])
def test_reduced_exponent_range_saturates_at_max_finite(name):
    fmt = element_format(name)
    above, far_above = (min(fmt.max_finite * f, 3.4e38) for f in (1.01, 1e3))  # above the format, finite in FP32
    x = torch.tensor([[above, -above, far_above, -far_above]])
    y = _identity_layer(Scheme(fmt, operands=("act",)), 4)(x)
    assert y.tolist() == [[fmt.max_finite, -fmt.max_finite, fmt.max_finite, -fmt.max_finite]]


@pytest.mark.parametrize("man_bits", [7, 3, 1])
def test_truncation_of_e8_formats_is_mantissa_bit_masking(man_bits):
    x = torch.randn(16, 64) * 1e3
    y = _identity_layer(Scheme(element_format(f"e8m{man_bits}"), Rounding.TRUNC, operands=("act",)), 64)(x)
    keep = ~((1 << (23 - man_bits)) - 1)
    assert torch.equal(y.detach(), (x.view(torch.int32) & keep).view(torch.float32))


def _grid(fmt):
    """Every finite non-negative value of `fmt`, sorted."""
    from snip_ops.cast import decode

    values = decode(torch.arange(1 << (fmt.bits - 1)), fmt)
    return torch.unique(values[torch.isfinite(values)])


def test_truncation_of_narrow_formats_is_toward_zero_onto_the_grid():
    fmt = element_format("e4m3")
    grid = _grid(fmt)
    x = _values_in_range(fmt, seed=1).clamp(-fmt.max_finite, fmt.max_finite)
    y = _identity_layer(Scheme(fmt, Rounding.TRUNC, operands=("act",)), 64)(x).detach()
    # the largest grid value not above |x|, with x's sign
    below = grid[torch.searchsorted(grid, x.abs().reshape(-1), right=True) - 1].reshape(x.shape)
    assert torch.equal(y, torch.copysign(below, x))


def test_stochastic_rounding_picks_a_neighbour_with_the_right_frequency():
    fmt = element_format("e4m3")
    # 1.3 lies between the E4M3 neighbours 1.25 and 1.375: up with probability 0.4
    x = torch.full((64, 64), 1.3)
    lin = _identity_layer(Scheme(fmt, Rounding.SR, operands=("act",)), 64)
    outs = torch.stack([lin(x).detach() for _ in range(4)])  # each forward: a new SR offset
    assert set(outs.unique().tolist()) == {1.25, 1.375}
    up = (outs == 1.375).double().mean().item()
    assert abs(up - 0.4) < 6 * (0.4 * 0.6 / outs.numel()) ** 0.5  # binomial standard error of the frequency
    assert not torch.equal(outs[0], outs[1])                 # fresh random bits every step


def test_operand_and_gemm_selection():
    fmt = element_format("e4m3")
    p = exmy_precision(4, 3, operands=("grad",), gemms=("dgrad", "wgrad"))
    assert p.fprop.is_bf16 and p.dgrad.act is None and p.dgrad.weight is None
    assert p.dgrad.grad == p.wgrad.grad and p.wgrad.grad.element.exp_bits == 4
    assert p.wgrad.grad.scale == ScaleKind.NONE and p.wgrad.grad.rounding == Rounding.RNE

    # dgrad with only the gradient simulated: dx = Q(dy) w, forward untouched
    k = 16
    lin = SnipLinear(k, k, bias=False, precision=Scheme(fmt, operands=("grad",), gemms=("dgrad",)).precision())
    with torch.no_grad():
        lin.weight.copy_(torch.eye(k))
    x = torch.randn(4, k, requires_grad=True)
    dy = torch.randn(4, k) * 3
    y = lin(x)
    assert torch.equal(y.detach(), x.detach())
    y.backward(dy)
    assert torch.equal(x.grad, dy.to(torch.float8_e4m3fn).float())
    assert_within_gemm_bound(lin.weight.grad, dy.t(), x.detach().t(), what="wgrad not simulated")


def test_scaling_options_and_parse_errors():
    assert parse_scheme("e4m3:tensor").spec().block == (0, 0) and parse_scheme("e4m3:tensor").spec().scale == ScaleKind.FP32
    assert parse_scheme("e2m1:sr:1x32").spec().block == (1, 32)
    assert parse_scheme("e8m3").spec().scale == ScaleKind.NONE
    # with tensor scaling E4M3 keeps values far below its smallest subnormal
    x = torch.full((2, 8), 1e-6)
    assert (_identity_layer(parse_scheme("e4m3:tensor:ops=act"), 8)(x) == 1e-6).all()
    for bad in ("e4m3:fast", "e4m3:ops=bias", "e4m3:gemms=forward", "e9m2"):
        with pytest.raises(ValueError):
            parse_scheme(bad)
    assert parse_scheme("E8M3:SR:gemms=wgrad+fprop").gemms == ("fprop", "wgrad")
    assert set(GEMMS) == {"fprop", "dgrad", "wgrad"}
