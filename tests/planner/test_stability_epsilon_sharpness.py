"""The stability paper's sharpness (planner.stability.epsilon_sharpness): the box ascent reaches the closed-form
maximum of a quadratic and grows with eps there; every evaluated point lies in the box; the result is >= 0,
deterministic for a seed, and the measured model is left exactly as it was."""

import pytest
import torch

from bounds import gamma
from planner.stability import EpsilonSharpnessConfig, epsilon_sharpness
from planner.stability.epsilon_sharpness import last_token_loss, maximise_in_box

def _quadratic(n=257, seed=0):
    """f(theta) = 1/2 sum a_i theta_i^2 in float64, a_i > 0, every |theta_i| >= 0.1."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.rand(n, generator=gen, dtype=torch.float64) + 0.5
    theta = (torch.rand(n, generator=gen, dtype=torch.float64) + 0.1) * torch.sign(torch.randn(n, generator=gen, dtype=torch.float64))
    return a, theta


@pytest.mark.parametrize("eps", [1e-4, 1e-3, 1e-2, 5e-2])
def test_ascent_reaches_the_closed_form_maximum_of_a_quadratic(eps):
    a, theta = _quadratic()
    p = theta.clone().requires_grad_()
    clean, best = maximise_in_box(lambda: 0.5 * (a * p * p).sum(), [p], eps, steps=5, step_size=0.5,
                                  generator=torch.Generator().manual_seed(3))
    # Separable and convex: the maximum is the vertex moving each theta_i away from 0, reached while
    # theta_i + delta_i keeps theta_i's sign (eps (|theta_i| + 1) < 0.1 <= |theta_i| here) and the steps
    # cross the box from any start (5 x 0.5 half-widths >= 2).
    exact = 0.5 * (a * (theta.abs() + eps * (theta.abs() + 1)) ** 2).sum()
    assert clean == pytest.approx(float(0.5 * (a * theta * theta).sum()), rel=gamma(len(a) + 4, torch.float64))
    # same formula on the same float64 inputs, summed in another order: gamma_n of float64 per term bound
    assert best == pytest.approx(float(exact), rel=gamma(len(a) + 8, torch.float64))
    assert torch.equal(p.detach(), theta)  # put back


def test_sharpness_of_the_quadratic_grows_with_eps():
    a, theta = _quadratic(seed=1)
    p = theta.clone().requires_grad_()
    phis = []
    for eps in (1e-4, 1e-3, 1e-2, 5e-2):
        clean, best = maximise_in_box(lambda: 0.5 * (a * p * p).sum(), [p], eps, 5, 0.5, torch.Generator().manual_seed(0))
        phis.append(100 * (best - clean) / (1 + clean))
    assert all(x > 0 for x in phis) and all(x < y for x, y in zip(phis, phis[1:]))


def test_ascent_never_reports_less_than_the_unperturbed_value():
    # theta = 0 maximises f = 1 - |theta|^2 / 2: no point of the box is higher, the result is exactly f(0)
    p = torch.zeros(64, dtype=torch.float64, requires_grad=True)
    clean, best = maximise_in_box(lambda: 1 - 0.5 * (p * p).sum(), [p], 0.1, 5, 0.5, torch.Generator().manual_seed(0))
    assert clean == best == 1.0


def test_every_evaluated_point_lies_in_the_box(model_and_batches):
    model, batches = model_and_batches
    eps = 2e-3
    params = [p for p in model.parameters() if p.requires_grad]
    origin = [p.detach().clone() for p in params]
    # With w the float32 half-width the ascent clips to, a point is fl(o + d), |d| <= w, so
    # |fl(o + d) - o| <= w + u (|o| + w), u = 2^-24 the float32 unit roundoff; checked in float64 (exact here)
    u = 2.0 ** -24
    widths = [(eps * (o.abs() + 1)).double() for o in origin]
    bounds = [w + u * (o.double().abs() + w) for o, w in zip(origin, widths)]
    excess, moved = [], []

    def check(_module, _inputs):
        steps = [(p.detach().double() - o.double()).abs() for p, o in zip(params, origin)]
        excess.append(max(float((s - b).max()) for s, b in zip(steps, bounds)))
        moved.append(max(float((s / w).max()) for s, w in zip(steps, widths)))

    handle = model.register_forward_pre_hook(check)
    try:
        result = epsilon_sharpness(model, batches, EpsilonSharpnessConfig(eps=eps, steps=4))
    finally:
        handle.remove()
    assert len(excess) == len(batches) * (1 + 4 + 1)  # the clean point, 4 ascent steps, the last point
    assert max(excess) <= 0
    assert max(moved) >= 1  # it reached the box's faces (the clean evaluations have moved == 0)
    assert result.mean > 0 and result.n == len(batches)


def test_nonnegative_deterministic_and_growing_with_eps_on_a_model(model_and_batches):
    model, batches = model_and_batches
    cfg = EpsilonSharpnessConfig(eps=1e-3)
    a = epsilon_sharpness(model, batches, cfg, seed=7)
    assert a == epsilon_sharpness(model, batches, cfg, seed=7)
    assert a != epsilon_sharpness(model, batches, cfg, seed=8)
    assert a.worst_loss >= a.clean_loss and a.mean >= 0 and a.stderr == pytest.approx(a.std / a.n ** 0.5)
    with torch.no_grad():
        clean = sum(float(last_token_loss(model, b)) for b in batches) / len(batches)
    assert a.clean_loss == clean
    means = [epsilon_sharpness(model, batches, EpsilonSharpnessConfig(eps=e)).mean for e in (1e-4, 1e-3, 1e-2)]
    assert all(x < y for x, y in zip(means, means[1:]))


def test_last_token_loss_reads_only_the_last_position(model_and_batches):
    model, batches = model_and_batches
    window = batches[0]
    logits = model(window[:, :-1])
    expected = torch.nn.functional.cross_entropy(logits[:, -1].double(), window[:, -1])
    assert torch.equal(last_token_loss(model, window), expected)
    assert last_token_loss(model, window).dtype == torch.float64


def test_config_validation():
    for bad in (dict(eps=0.0), dict(steps=0), dict(step_size=0.0)):
        with pytest.raises(ValueError):
            EpsilonSharpnessConfig(**bad)
    with pytest.raises(ValueError):
        epsilon_sharpness(torch.nn.Linear(2, 2), [])
