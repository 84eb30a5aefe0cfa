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


# the first half of the bench's 100-step cosine decay (noise on), then its second half (noise off): a branch's
# first plan priced at the branch's end
COSINE = [0.1 + 0.45 * (1 + math.cos(math.pi * t / 99)) for t in range(100)]
FIRST_HALF, SECOND_HALF = [r / COSINE[0] for r in COSINE[:50]], [r / COSINE[0] for r in COSINE[50:]]


@pytest.mark.parametrize("name", SCHEDULES)
def test_tabulated_fraction_at_the_run_end_matches_the_recursion(name):
    ratios, after = SCHEDULES[name], SECOND_HALF
    exact = horizon_fraction_exact(RATES, ratios, after)
    got = HorizonTable(ratios, sum(after))(RATES.float()).double()
    # phi's table error (INTERPOLATION of its scale) times the factor exp(-2 a R), plus the float32 factor's own:
    # its argument rounded (6e-8 of 2 a R, relative) and its underflow (values below 1e-30 of phi's scale)
    x = 2 * sum(after) * RATES
    scale = horizon_fraction_exact(RATES, ratios).cummax(0).values
    tol = scale * (torch.exp(-x) * (INTERPOLATION + 1e-7 * x) + 1e-30)
    assert ((got - exact).abs() <= tol)[2:].all(), (name, ((got - exact).abs() / tol)[2:].max())
    assert (got[:2] == 0).all()


def test_noise_free_steps_forget_the_stiff_directions_and_keep_the_flat_ones():
    """After the plan's life the deviation only contracts: the stiff directions' excess decays to nothing by the
    run's end, the flat ones keep what they gathered; no step after the horizon (R = 0) is the horizon's end."""
    flat, stiff = torch.tensor([1e-9], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    at_end = horizon_fraction_exact(flat, FIRST_HALF, SECOND_HALF).item()
    assert at_end == pytest.approx(horizon_fraction_exact(flat, FIRST_HALF).item(), rel=1e-6)
    stiff_end = horizon_fraction_exact(stiff, FIRST_HALF, SECOND_HALF).item()
    settled_at_plan_end = horizon_fraction_exact(stiff, FIRST_HALF).item()
    assert stiff_end == pytest.approx(settled_at_plan_end * math.exp(-2 * sum(SECOND_HALF)), rel=1e-12)
    assert stiff_end < 1e-10 * settled_at_plan_end
    assert (HorizonTable(FIRST_HALF, 0.0)(RATES.float()) == HorizonTable(FIRST_HALF)(RATES.float())).all()
    # a step with r = 0 contracts nothing
    torch.testing.assert_close(horizon_fraction_exact(RATES, FIRST_HALF, [0.0] * 5),
                               horizon_fraction_exact(RATES, FIRST_HALF), rtol=0, atol=0)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="after"):
            HorizonTable(FIRST_HALF, bad)
        with pytest.raises(ValueError, match="after"):
            horizon_fraction_exact(RATES, FIRST_HALF, [bad])
