"""WD's horizon under a learning-rate schedule (planner.horizon): the tabulated phi_T against its recursion, the
recursion against the discrete iteration it models, the constant-rate closed form and the limits; the excess loss
carried on to the run's end through noise-free steps."""

import math

import pytest
import torch

from planner.horizon import HorizonTable, horizon_fraction_exact

T = 50
# a = lr D G from far below the grid (first-order branch) to far above it (saturated), with exact zeros
RATES = torch.cat([torch.zeros(2), torch.logspace(-14, 5, 3000, dtype=torch.float64)])
SCHEDULES = {
    "constant": [1.0] * T,
    # the last half of a cosine decay to a tenth, relative to its first step (the bench's second re-plan)
    "cosine": [(0.1 + 0.45 * (1 + math.cos(math.pi * (50 + t) / 99))) / 0.55 for t in range(T)],
    "warmup": [(t + 1) / 10 for t in range(10)] + [1.0] * 5,
    "run ends": [1.0] * 10 + [0.0] * 5,
    "tiny steps": [0.0, 1e-6, 2.0, 1e-3],
}
# linear interpolation in log a on 64 points a decade: about (ln 10 / 64)^2 / 8 of phi's scale, which is phi
# itself where phi grows with a and its peak at lower a where a schedule's late small rates make it fall
INTERPOLATION = 1e-3


@pytest.mark.parametrize("name", SCHEDULES)
def test_tabulated_fraction_matches_the_recursion(name):
    ratios = SCHEDULES[name]
    exact = horizon_fraction_exact(RATES, ratios)
    got = HorizonTable(ratios)(RATES.float()).double()
    assert got.dtype == torch.float64 and got.shape == RATES.shape
    assert (got[:2] == 0).all() and (exact[:2] == 0).all()
    scale = exact[2:].cummax(0).values  # RATES increase
    rel = (got - exact)[2:].abs() / scale
    assert rel.max() < INTERPOLATION, (name, rel.max())


def test_constant_rate_is_the_closed_form_horizon():
    exact = horizon_fraction_exact(RATES, [1.0] * T)
    torch.testing.assert_close(exact, -torch.expm1(-2 * T * RATES), rtol=1e-12, atol=0)


def test_limits_flat_directions_gather_the_squared_rates_stiff_ones_settle_at_the_last_rate():
    ratios = SCHEDULES["cosine"]
    flat = torch.tensor([1e-9], dtype=torch.float64)
    stiff = torch.tensor([1e4], dtype=torch.float64)
    assert horizon_fraction_exact(flat, ratios).item() == pytest.approx(2 * 1e-9 * sum(r * r for r in ratios),
                                                                        rel=1e-6)
    assert horizon_fraction_exact(stiff, ratios).item() == pytest.approx(ratios[-1], rel=1e-12)
    # the decay only lowers the excess loss against the constant rate, at every curvature
    assert (horizon_fraction_exact(RATES, ratios) <= horizon_fraction_exact(RATES, [1.0] * T) + 1e-15).all()


def test_recursion_is_the_variance_of_the_noisy_iteration_for_small_steps():
    """The discrete iteration theta <- (1 - r_t a) theta + r_t lr D noise has variance V_{t+1} = (1 - r_t a)^2 V_t
    + r_t^2 (lr D)^2 s exactly; in units of the stationary variance at lr, (lr D)^2 s / (2 a), that is
    psi_{t+1} = (1 - r_t a)^2 psi_t + 2 a r_t^2. phi (the continuous-time solution) agrees to O(a)."""
    ratios = SCHEDULES["cosine"] * 20  # 1000 steps: the stiffest rate below settles too
    for a in (1e-4, 1e-3, 1e-2):
        psi = 0.0
        for r in ratios:
            psi = (1 - r * a) ** 2 * psi + 2 * a * r * r
        phi = horizon_fraction_exact(torch.tensor([a], dtype=torch.float64), ratios).item()
        assert phi == pytest.approx(psi, rel=2 * a), a


def test_no_step_or_bad_rates_are_refused():
    assert (HorizonTable([0.0] * 3)(RATES.float()) == 0).all()
    assert (HorizonTable([1.0] * 3)(-RATES.float()) == 0).all()  # a negative curvature reads as none
    for bad in ([], [1.0, -0.5], [float("nan")], [float("inf")]):
        with pytest.raises(ValueError, match="lr_ratios"):
            HorizonTable(bad)
        with pytest.raises(ValueError, match="lr_ratios"):
            horizon_fraction_exact(RATES, bad)
