"""experiments.forward_train: the AdamW step its routes feed is torch.optim.AdamW's, each route feeds the moments the
gradient it names, the drift price's squared mean is unbiased, and the bench runs end to end in seconds."""

import json
import math
import os
import sys
from types import SimpleNamespace
from pathlib import Path

import pytest
import torch
from torch import nn

from experiments.forward_train import (ROUTES, RouteRun, RoutedError, drift_price, forward_recipe,
                                       pair_mean_of_squares)
from snip_ops import gemm as snip_gemm
from snip_ops.formats import Rounding, recipe
import warm_python

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")


class _Toy(nn.Module):
    """Two linear layers (block 0 and block 2, by their names) and a loss, as the routes' hooks need."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(24, 40), nn.Tanh(), nn.Linear(40, 8))

    def forward(self, x):
        return self.net(x)

    def loss(self, batch):
        return self(batch).pow(2).mean()


def _routed(route: str):
    """A two-layer model under AdamW (two parameter groups, weight decay on one) and the route's hooks set up on it."""
    torch.manual_seed(0)
    model = _Toy()
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2]},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=3e-3,
                            weight_decay=0.1)
    hooks = RoutedError(route, 3.0, block=0, seed=0, grad_clip=1.0)
    hooks.on_setup(model, opt)
    return model, opt, hooks


def _fill_grads(params, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    grads = [torch.randn(p.shape, generator=gen) for p in params]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    return grads


def test_adam_step_is_torch_adamw():
    """Fed the loop's gradient in both moments, three steps of the route's AdamW land where torch's AdamW does."""
    model, opt, hooks = _routed("both")
    reference = [p.detach().clone().requires_grad_() for p in model.parameters()]
    ref_opt = torch.optim.AdamW([{"params": [reference[0], reference[2]]},
                                 {"params": [reference[1], reference[3]], "weight_decay": 0.0}], lr=3e-3,
                                weight_decay=0.1)
    for step in range(3):
        grads = _fill_grads(hooks.params, step)
        by_shape = {id(p): g for p, g in zip(hooks.params, grads)}
        for p, r in zip(model.parameters(), reference):
            r.grad = by_shape[id(p)].clone()
        hooks.exact = None  # route both: the loop's gradient alone
        opt.step()  # replaced by the route's
        ref_opt.step()
    for p, r in zip(model.parameters(), reference):
        torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_each_route_feeds_the_gradient_it_names(route):
    """exact: the exact gradient; own: the loop's (perturbed) one; other: exact plus the other batch's change;
    mean2: exact plus the mean of the two changes. Checked through the moments one step leaves."""
    model, opt, hooks = _routed(route)
    own = _fill_grads(hooks.params, 1)
    gen = torch.Generator().manual_seed(2)
    hooks.exact = None if route == "exact" else [torch.randn(p.shape, generator=gen) for p in hooks.params]
    hooks.other_change = [torch.randn(p.shape, generator=gen) for p in hooks.params]
    first, second = ROUTES[route]
    expected = {"own": own}
    if hooks.exact is not None:
        expected.update(exact=hooks.exact,
                        other=[e + o for e, o in zip(hooks.exact, hooks.other_change)],
                        mean2=[e + 0.5 * (g - e + o) for g, e, o in zip(own, hooks.exact, hooks.other_change)])
    else:
        expected.update(exact=own)  # route exact: the loop's own backward is exact
    opt.step()
    for i, p in enumerate(hooks.params):
        state = opt.state[p]
        torch.testing.assert_close(state["exp_avg"], 0.1 * expected[first][i])
        torch.testing.assert_close(state["exp_avg_sq"], 0.001 * expected[second][i] ** 2)


def test_exact_route_has_the_error_off_and_the_others_on():
    assert not _routed("exact")[2].enabled
    assert all(_routed(r)[2].enabled for r in ROUTES if r != "exact")


def test_pair_mean_of_squares_is_the_squared_mean_without_noise():
    """Over pairs of distinct samples: for samples m + n_i it is m^2 + (sum_{i != k} n_i n_k) / (K (K - 1)),
    checked against that sum written out."""
    gen = torch.Generator().manual_seed(0)
    samples = [[torch.randn(5, generator=gen)] for _ in range(4)]
    expected = sum(samples[i][0] * samples[k][0] for i in range(4) for k in range(4) if i != k) / 12
    torch.testing.assert_close(pair_mean_of_squares(samples, 0), expected)
    same = [[torch.full((3,), 2.0)]] * 3
    torch.testing.assert_close(pair_mean_of_squares(same, 0), torch.full((3,), 4.0))


def test_drift_price_of_a_constant_bias():
    """One parameter, a constant bias b under curvature G and preconditioner D: Adam's drift settles at b / G with
    rate a = lr D G, its loss 1/2 G (b / G)^2 (1 - exp(-a T))^2."""
    b, g, d, lr, steps = 0.3, 2.0, 5.0, 1e-3, 150
    price = drift_price([[torch.tensor([b])]] * 3, [torch.tensor([g])], [torch.tensor([d])], lr, steps)
    a = lr * d * g
    assert price == pytest.approx(0.5 * g * (b / g) ** 2 * (1 - math.exp(-a * steps)) ** 2, rel=1e-6)


def test_study_runs_end_to_end(tmp_path):
    env = {**os.environ, "SNIP_BENCH_CACHE": str(tmp_path / "cache")}
    warm_python.run([sys.executable, "-m", "experiments.forward_train", "--phases", "2", "--blocks", "1",
                    "--seeds", "0,1", "--steps", "2", "--eval-batches", "1", "--price-batches", "2", "--workers", "2",
                    "--results", str(tmp_path)], cwd=ROOT, check=True, capture_output=True, text=True, timeout=600,
                   env=env)
    out = json.loads((tmp_path / "cpu-planner-forward-train.json").read_text())
    assert [(r["block"], r["route"]) for r in out["routes"]] == [(1, r) for r in ROUTES if r != "exact"]
    both = next(r for r in out["routes"] if r["route"] == "both")
    assert both["share_of_both"] == 1.0 and len(both["gaps"]) == 2
    assert [r["block"] for r in out["prices"]] == [0, 1, 2, 3]
    (energy,) = out["sr_over_rne_error_energy"].values()  # per layer at the one checkpoint
    assert len(energy) == 28 and all(0 < r < 10 for r in energy.values())
    assert all(r["ld"] >= 0 and r["drift_whole"] >= 0 and r["truth"] is None for r in out["prices"])
    assert (tmp_path / "cpu-planner-forward-train.md").exists()
    cache = json.loads((tmp_path / "cache" / "forward-train-routes.json").read_text())
    assert set(cache["numerics"]) == {"tiny/2"}  # what the routes were trained under (common.check_cache_numerics)


def test_sr_forward_rounds_the_forward_operands_stochastically_and_nothing_else():
    sr, fp4 = forward_recipe("sr"), recipe("fp4")
    assert forward_recipe("rne") is fp4
    assert (sr.act.rounding, sr.weight.rounding, sr.grad) == (Rounding.SR, Rounding.SR, fp4.grad)
    assert (sr.act.block, sr.weight.block, sr.act.element) == (fp4.act.block, fp4.weight.block, fp4.act.element)
    with pytest.raises(ValueError, match="rounding must be one of"):
        forward_recipe("nearest")


def test_sr_forward_error_has_mean_zero_where_rne_has_a_bias():
    """Over 64 steps' bits (the offset), the SR forward error averages out: its mean is within 6 standard errors of
    zero everywhere, while the RNE error, the same every step, is its own mean."""
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(16, 256, generator=gen), torch.randn(32, 256, generator=gen)
    exact = snip_gemm.fp32_mm(x, w.t())
    errors = torch.stack([snip_gemm.fprop(x, w, forward_recipe("sr"), seed=5, offset=i, emulate=True) - exact
                          for i in range(64)])
    assert not torch.equal(errors[0], errors[1])
    assert float((errors.mean(0).abs() / (errors.std(0) / 8)).max()) < 6
    rne = snip_gemm.fprop(x, w, forward_recipe("rne"), emulate=True) - exact
    assert float(rne.abs().mean()) > 3 * float(errors.mean(0).abs().mean())


def test_run_keys_share_the_exact_reference_across_roundings():
    def run(route, rounding):
        return RouteRun(100, 0, route, 1, 100, 3.0, 16, rounding)
    assert run("exact", "rne").key == run("exact", "sr").key
    assert run("both", "rne").key != run("both", "sr").key
    assert RouteRun(100, 0, "both", 1, 100, 3.0, 16).key == "100/0/both/1/100/3/e16"


def test_study_runs_with_stochastic_forward_rounding_and_chosen_routes(tmp_path):
    env = {**os.environ, "SNIP_BENCH_CACHE": str(tmp_path / "cache")}
    warm_python.run([sys.executable, "-m", "experiments.forward_train", "--phases", "2", "--blocks", "0",
                    "--seeds", "0,1", "--steps", "2", "--eval-batches", "1", "--price-batches", "2", "--routes",
                    "second_moment", "--rounding", "sr", "--price-phases=", "--results", str(tmp_path)], cwd=ROOT,
                   check=True, capture_output=True, text=True, timeout=600, env=env)
    out = json.loads((tmp_path / "cpu-planner-forward-train.json").read_text())
    assert out["rounding"] == "sr" and [r["route"] for r in out["routes"]] == ["both", "second_moment"]
    assert out["prices"] == [] and "Prices" not in (tmp_path / "cpu-planner-forward-train.md").read_text()


def test_alternating_sign_flips_the_errors_sign_every_step_and_the_others_keep_it():
    """on_step sets the step's amplitude; neither route needs the exact gradient, a route that does gets it."""
    batch = torch.randn(6, 24, generator=torch.Generator().manual_seed(3))
    signs = {}
    for route in ("alternating_sign", "both"):
        model, _, hooks = _routed(route)
        signs[route] = []
        for step in range(4):
            hooks.on_step(step, model, batch)
            signs[route].append(hooks.amplify)
            assert hooks.exact is None and hooks.enabled
    assert signs == {"alternating_sign": [3.0, -3.0, 3.0, -3.0], "both": [3.0] * 4}
    model, _, hooks = _routed("first_moment")
    hooks.on_step(0, model, batch)
    assert hooks.amplify == 3.0 and len(hooks.exact) == len(hooks.params) and hooks.other_change is None
    model, _, hooks = _routed("two_batch_mean")
    hooks.data = SimpleNamespace(get_batch=lambda *args: batch + 1.0)  # the toy model's "other batch"
    hooks.on_step(0, model, batch)
    assert len(hooks.other_change) == len(hooks.params)
