"""bench_planner.py's diagnostics snip_cal, snip_oracle, snip_trend and snip_share: AdjustedStats makes the planner solve with
every measured layer's statistics passed through an adjustment, and otherwise behaves as the hooks it wraps;
weighted_wd scales the dgrad and wgrad WD sensitivities only, foreseen_ld the curvature (so LD) only; TrendedStats
the curvature by the mean over a plan's life of its growth since the previous measurement; DgradSignalShare dgrad's
WD by the signal share the measurement gave wgrad's."""

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_planner import (AdjustedStats, DgradSignalShare, GrowthToEnd, TrendedStats, end_and_growth,  # noqa: E402
                           foreseen_ld, life_mean, weighted_wd)
from planner.cost import LayerShape  # noqa: E402
from planner.stats import LayerStats, PlannerStats  # noqa: E402


def _stats(step: int = 7) -> PlannerStats:
    errors = {"fp4": {"fprop": 0.01, "dgrad": 0.02, "wgrad": 0.03}}
    layers = tuple(LayerStats(LayerShape(f"l{i}", 16, 8, 32), out_rms=1.0, grad_out_rms=0.5, grad_in_rms=0.25,
                              weight_grad_rms=0.125, curvature=2.0 + i, s_dgrad=3.0 + i, s_wgrad=5.0 + i, errors=errors)
                   for i in range(2))
    return PlannerStats(layers=layers, loss=1.5, step=step, diagnostics={"wgrad_signal_share": 0.25})


class _Hooks:
    def __init__(self):
        self.planner = SimpleNamespace(measure=lambda batch, step=7, *args, **kwargs: _stats(step))
        self.plans, self.steps, self.setups = ["a plan"], [], 0

    def on_setup(self, model, opt) -> None:
        self.setups += 1

    def on_step(self, step, model, batch):
        self.steps.append(step)
        return "stepped"


def _adjusted(adjust) -> tuple[PlannerStats, _Hooks, AdjustedStats]:
    hooks = _Hooks()
    wrapped = AdjustedStats(hooks, adjust)
    wrapped.on_setup(model=None, opt=None)
    stats = hooks.planner.measure("batch", loss_fn=None)
    assert hooks.setups == 1 and (stats.loss, stats.step) == (1.5, 7)
    return stats, hooks, wrapped


def test_adjusted_stats_behaves_as_the_hooks_it_wraps():
    _, hooks, wrapped = _adjusted(lambda s: s)
    assert wrapped.on_step(3, None, None) == "stepped" and hooks.steps == [3]
    assert wrapped.plans == ["a plan"] and wrapped.planner is hooks.planner


def test_weighted_wd_scales_the_backward_sensitivities_only():
    stats, _, _ = _adjusted(weighted_wd({"dgrad": 1.5, "wgrad": 0.25}))
    for got, want in zip(stats.layers, _stats().layers):
        assert got.s_dgrad == want.s_dgrad * 1.5 and got.s_wgrad == want.s_wgrad * 0.25
        assert (got.curvature, got.errors, got.shape) == (want.curvature, want.errors, want.shape)


def test_foreseen_ld_scales_each_layers_curvature_by_its_growth_over_a_plans_life():
    stats, _, _ = _adjusted(foreseen_ld({"l0": 16.0, "l1": 0.25}, power=0.5))
    got, want = stats.by_name(), _stats().by_name()
    assert got["l0"].curvature == want["l0"].curvature * 4.0 and got["l1"].curvature == want["l1"].curvature * 0.5
    assert got["l0"].ld("fp4") == pytest.approx(want["l0"].ld("fp4") * 4.0, rel=1e-15)
    for n in got:
        assert (got[n].s_dgrad, got[n].s_wgrad, got[n].errors) == (want[n].s_dgrad, want[n].s_wgrad, want[n].errors)


def test_foreseen_ld_takes_the_price_of_the_growth_it_is_given():
    stats, _, _ = _adjusted(foreseen_ld({"l0": 16.0, "l1": 0.25}, power=0.5, price=end_and_growth))
    got, want = stats.by_name(), _stats().by_name()
    assert got["l0"].curvature == want["l0"].curvature * 7.0 and got["l1"].curvature == want["l1"].curvature * 0.5


def test_foreseen_ld_fails_on_a_layer_without_a_growth():
    hooks = _Hooks()
    AdjustedStats(hooks, foreseen_ld({"l0": 2.0}, power=1.0)).on_setup(model=None, opt=None)
    with pytest.raises(KeyError, match="l1"):
        hooks.planner.measure("batch")


def test_growth_to_end_prices_each_plan_by_the_growth_still_ahead_of_it():
    hooks = _Hooks()
    wrapped = GrowthToEnd(hooks, {"l0": 16.0, "l1": 0.25}, steps=100)  # the growth over the whole branch
    wrapped.on_setup(model=None, opt=None)
    first = hooks.planner.measure("batch", 0).by_name()  # all of it ahead: end_and_growth(16) = 31, (0.25) = 0.25
    assert (first["l0"].curvature, first["l1"].curvature) == (2.0 * 31.0, 3.0 * 0.25)
    assert (first["l0"].s_dgrad, first["l0"].s_wgrad, first["l0"].errors) == (3.0, 5.0, _stats().layers[0].errors)
    half = hooks.planner.measure("batch", 50).by_name()  # half of it ahead: 16 ** 0.5 = 4 -> 7, 0.25 ** 0.5 = 0.5
    assert (half["l0"].curvature, half["l1"].curvature) == (2.0 * 7.0, 3.0 * 0.5)
    end = hooks.planner.measure("batch", 120).by_name()  # past the end: nothing ahead
    assert (end["l0"].curvature, end["l1"].curvature) == (2.0, 3.0)


def test_life_mean_is_the_mean_of_a_geometric_growth_over_the_interval():
    assert life_mean(1.0) == 1.0 and life_mean(1.0 + 1e-12) == 1.0
    assert life_mean(math.e) == pytest.approx(math.e - 1.0, rel=1e-14)
    assert life_mean(0.5) == pytest.approx(0.5 / math.log(2.0), rel=1e-14)  # a shrinking curvature too
    steps = 100_000  # the mean of growth ** t over [0, 1], midpoint rule
    assert life_mean(40.0) == pytest.approx(sum(40.0 ** ((i + 0.5) / steps) for i in range(steps)) / steps, rel=1e-8)


def test_trended_stats_prices_each_curvature_over_the_plans_life_from_the_previous_measurement():
    hooks = _Hooks()
    wrapped = TrendedStats(hooks, interval=10, before={"l0": 0.5, "l1": 3.0})  # measured 10 steps before step 0
    wrapped.on_setup(model=None, opt=None)
    first = hooks.planner.measure("batch", 0).by_name()  # raw curvatures 2 and 3: growth 4 and 1 over one interval
    assert first["l0"].curvature == pytest.approx(2.0 * 3.0 / math.log(4.0), rel=1e-14)
    assert first["l1"].curvature == 3.0 and first["l1"].s_dgrad == 4.0 and first["l0"].errors == _stats().layers[0].errors
    second = hooks.planner.measure("batch", 20).by_name()  # against the raw curvatures of step 0: no growth
    assert (second["l0"].curvature, second["l1"].curvature) == (2.0, 3.0)
    assert wrapped.plans == ["a plan"]


def test_trended_stats_reads_growth_per_interval_and_leaves_an_unmeasured_layer_as_it_is():
    hooks = _Hooks()
    TrendedStats(hooks, interval=10, before={"l0": 0.0, "l1": 0.75}).on_setup(model=None, opt=None)
    got = hooks.planner.measure("batch", 10).by_name()  # 20 steps after `before`: growth 4 is 2 per interval
    assert got["l0"].curvature == 2.0  # no curvature before: no growth to read
    assert got["l1"].curvature == pytest.approx(3.0 / math.log(2.0), rel=1e-14)


def test_end_and_growth_is_the_end_value_plus_the_rise_only():
    assert end_and_growth(1.0) == 1.0 and end_and_growth(4.0) == 7.0  # LD(end) 4 plus its rise 3
    assert end_and_growth(0.5) == 0.5  # a falling LD: its end value, no credit for the fall


def test_trended_stats_takes_the_price_of_the_growth_it_is_given():
    hooks = _Hooks()
    TrendedStats(hooks, interval=10, before={"l0": 0.5, "l1": 6.0}, price=end_and_growth).on_setup(model=None, opt=None)
    got = hooks.planner.measure("batch", 0).by_name()  # growth 4 and 0.5 over one interval
    assert (got["l0"].curvature, got["l1"].curvature) == (2.0 * 7.0, 3.0 * 0.5)
    assert got["l0"].s_dgrad == 3.0 and got["l0"].s_wgrad == 5.0  # WD as measured


def test_dgrad_signal_share_scales_dgrads_wd_by_the_measured_share_only():
    hooks = _Hooks()
    DgradSignalShare(hooks).on_setup(model=None, opt=None)
    stats = hooks.planner.measure("batch", 3)
    assert stats.diagnostics == {"wgrad_signal_share": 0.25} and stats.step == 3
    for got, want in zip(stats.layers, _stats().layers):
        assert got.s_dgrad == want.s_dgrad * 0.25
        assert (got.s_wgrad, got.curvature, got.errors) == (want.s_wgrad, want.curvature, want.errors)
