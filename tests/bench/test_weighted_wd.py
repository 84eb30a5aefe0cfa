"""bench_planner.py's snip_cal diagnostic: WeightedWD makes the planner solve with each layer's dgrad and wgrad WD
sensitivity times its weight, every other statistic as measured, and otherwise behaves as the hooks it wraps."""

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_planner import WeightedWD  # noqa: E402
from planner.cost import LayerShape  # noqa: E402
from planner.stats import LayerStats, PlannerStats  # noqa: E402


def _stats() -> PlannerStats:
    errors = {"fp4": {"fprop": 0.01, "dgrad": 0.02, "wgrad": 0.03}}
    layers = tuple(LayerStats(LayerShape(f"l{i}", 16, 8, 32), out_rms=1.0, grad_out_rms=0.5, grad_in_rms=0.25,
                              weight_grad_rms=0.125, curvature=2.0 + i, s_dgrad=3.0 + i, s_wgrad=5.0 + i, errors=errors)
                   for i in range(2))
    return PlannerStats(layers=layers, loss=1.5, step=7)


class _Hooks:
    def __init__(self):
        self.planner = SimpleNamespace(measure=lambda *args, **kwargs: _stats())
        self.plans, self.steps, self.setups = ["a plan"], [], 0

    def on_setup(self, model, opt) -> None:
        self.setups += 1

    def on_step(self, step, model, batch):
        self.steps.append(step)
        return "stepped"


def test_weighted_wd_scales_the_backward_sensitivities_only():
    hooks = _Hooks()
    weighted = WeightedWD(hooks, {"dgrad": 1.5, "wgrad": 0.25})
    weighted.on_setup(model=None, opt=None)
    stats, measured = hooks.planner.measure("batch", loss_fn=None), _stats()
    assert hooks.setups == 1 and stats.loss == measured.loss and stats.step == measured.step
    for got, want in zip(stats.layers, measured.layers):
        assert got.s_dgrad == want.s_dgrad * 1.5 and got.s_wgrad == want.s_wgrad * 0.25
        assert (got.curvature, got.errors, got.shape) == (want.curvature, want.errors, want.shape)
    assert weighted.on_step(3, None, None) == "stepped" and hooks.steps == [3]
    assert weighted.plans == ["a plan"] and weighted.planner is hooks.planner
