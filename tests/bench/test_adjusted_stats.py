"""bench_planner.py's diagnostics snip_cal, snip_oracle and snip_signal: AdjustedStats makes the planner solve with
every measured layer's statistics passed through an adjustment, and otherwise behaves as the hooks it wraps;
weighted_wd scales the dgrad and wgrad WD sensitivities only, foreseen_ld the curvature (so LD) only;
AdamNormalisedWgrad scales wgrad's by the signal fraction of Adam's second moment (signal_fractions), measured at
every re-plan."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import bench_planner  # noqa: E402
from bench_planner import (AdamNormalisedWgrad, AdjustedStats, foreseen_ld, signal_fractions,  # noqa: E402
                           weighted_wd)
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


def test_foreseen_ld_fails_on_a_layer_without_a_growth():
    hooks = _Hooks()
    AdjustedStats(hooks, foreseen_ld({"l0": 2.0}, power=1.0)).on_setup(model=None, opt=None)
    with pytest.raises(KeyError, match="l1"):
        hooks.planner.measure("batch")


# --- snip_signal ------------------------------------------------------------------------------------

def _dot_model(features: int) -> tuple[nn.Module, dict[str, nn.Linear]]:
    """A model whose loss on rows x is sum(w . x): one row's weight gradient is the row itself."""
    model = nn.Linear(features, 1, bias=False)
    return model, {"dot": model}


def _dot_loss(model, rows):
    return model(rows).sum()


def _adam_after_one_step(model: nn.Module, grad: torch.Tensor) -> torch.optim.Adam:
    """Adam after one step on `grad`: its bias-corrected second moment is grad^2."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.weight.grad = grad.clone()
    opt.step()
    return opt


def test_signal_fraction_is_the_mean_over_pairs_of_sequences_of_their_gradients_dot_product():
    gen = torch.Generator().manual_seed(0)
    batch = torch.randn(5, 7, generator=gen, dtype=torch.float64).float()
    model, layers = _dot_model(7)
    v = torch.rand(1, 7, generator=gen) + 0.5
    opt = _adam_after_one_step(model, v.sqrt())
    pairs = [float(batch[a].double() @ batch[b].double()) for a in range(5) for b in range(5) if a != b]
    want = sum(pairs) / len(pairs) / float(v.double().sum())
    assert signal_fractions(model, layers, opt, batch, _dot_loss)["dot"] == pytest.approx(want, rel=1e-5)


def test_signal_fraction_of_identical_sequences_under_their_own_second_moment_is_one():
    model, layers = _dot_model(6)
    row = torch.linspace(-1.0, 2.0, 6)
    opt = _adam_after_one_step(model, row.unsqueeze(0))  # v_hat = g^2, and every sequence's gradient is g
    assert signal_fractions(model, layers, opt, row.repeat(4, 1), _dot_loss)["dot"] == pytest.approx(1.0, rel=1e-5)


def test_signal_fraction_is_unbiased_for_the_expected_gradients_square():
    """Gradients mu + noise (noise 4x mu per entry): the mean estimate over many batches is ||mu||^2 / sum(v_hat)
    within 4 standard errors, where the same batch's plain ||g||^2 reads mostly noise."""
    gen = torch.Generator().manual_seed(1)
    mu = torch.full((16,), 0.25)
    model, layers = _dot_model(16)
    opt = _adam_after_one_step(model, torch.ones(1, 16))  # sum(v_hat) = 16
    estimates = torch.tensor([signal_fractions(model, layers, opt, mu + torch.randn(8, 16, generator=gen), _dot_loss)["dot"]
                              for _ in range(400)], dtype=torch.float64)
    want = float(mu.pow(2).sum()) / 16
    assert abs(float(estimates.mean()) - want) < 4 * float(estimates.std()) / 20
    assert float(estimates.std()) > 0  # a real estimator, not the constant it should average to


def test_signal_fraction_refuses_a_single_sequence_or_an_untrained_optimizer():
    model, layers = _dot_model(4)
    opt = _adam_after_one_step(model, torch.ones(1, 4))
    with pytest.raises(ValueError, match="at least 2 sequences"):
        signal_fractions(model, layers, opt, torch.ones(1, 4), _dot_loss)
    with pytest.raises(ValueError, match="no Adam second moment"):
        signal_fractions(model, layers, torch.optim.Adam(model.parameters()), torch.ones(3, 4), _dot_loss)


def _signal_adjusted(monkeypatch, per_layer: dict[str, float]) -> tuple[PlannerStats, AdamNormalisedWgrad, list]:
    seen = []

    def fake_signal_fractions(model, layers, optimizer, batch, loss_fn):
        seen.append(batch)
        return per_layer
    monkeypatch.setattr(bench_planner, "signal_fractions", fake_signal_fractions)
    hooks = _Hooks()
    hooks.planner.config = SimpleNamespace(calib_batch_size=2)
    hooks.planner.model = hooks.planner.layers = hooks.planner.optimizer = hooks.planner.loss_fn = None
    wrapped = AdamNormalisedWgrad(hooks)
    wrapped.on_setup(model=None, opt=None)
    return hooks.planner.measure(torch.zeros(5, 3)), wrapped, seen


def test_adam_normalised_wgrad_scales_wgrad_by_the_wd_weighted_signal_fraction(monkeypatch):
    stats, wrapped, seen = _signal_adjusted(monkeypatch, {"l0": 0.5, "l1": 0.25})
    weights = [(5.0 + i) * 0.03 for i in range(2)]  # s_wgrad x e_wgrad of the largest error
    fraction = (weights[0] * 0.5 + weights[1] * 0.25) / sum(weights)
    assert wrapped.fractions == [pytest.approx(fraction, rel=1e-12)]
    assert [s.shape[0] for s in seen] == [2]  # the planner's calibration rows of the batch
    for got, want in zip(stats.layers, _stats().layers):
        assert got.s_wgrad == pytest.approx(want.s_wgrad * fraction, rel=1e-12)
        assert (got.s_dgrad, got.curvature, got.errors) == (want.s_dgrad, want.curvature, want.errors)


@pytest.mark.parametrize("per_layer, clipped", [({"l0": 2.0, "l1": 3.0}, 1.0), ({"l0": -0.5, "l1": 0.1}, 0.0)])
def test_adam_normalised_wgrad_clips_the_fraction_to_a_share(monkeypatch, per_layer, clipped):
    stats, wrapped, _ = _signal_adjusted(monkeypatch, per_layer)
    assert wrapped.fractions == [clipped]
    assert [s.s_wgrad for s in stats.layers] == [s.s_wgrad * clipped for s in _stats().layers]
