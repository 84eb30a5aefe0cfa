"""experiments.fp4_forward's structured_ld: the Gauss-Newton form of LD along a layer's actual FP4 forward error,
estimated from sampled-label cotangents summed per sequence, is unbiased for 1/2 e^T G e computed exactly from the
logits' change along e (tests/gauss_newton.py); measuring it leaves the plan and the SR counters as they were;
StructuredLD (the grid's snip_struct) makes the planner solve with every layer's curvature times structured_ld / LD in
FP4, and otherwise behaves as the hooks it wraps."""

from types import SimpleNamespace

import pytest
import torch

from experiments import fp4_forward
from experiments.fp4_forward import StructuredLD, fp4_output_errors, structured_ld
from gauss_newton import gauss_newton_along
from planner import LayerShape, LayerStats, PlannerStats
from snip_ops import SnipLinear, convert
from snip_train.model import Llama, LlamaConfig
from snip_train.state import sr_counters


def _model_and_batch(sequences: int = 4, length: int = 16):
    torch.manual_seed(0)
    model = convert(Llama(LlamaConfig.preset("tiny", n_layers=2, dim=64, n_heads=2, n_kv_heads=1, ffn_hidden=128,
                                             max_seq_len=length)))
    layers = {n: m for n, m in model.named_modules() if isinstance(m, SnipLinear)}
    batch = torch.randint(0, 256, (sequences, length + 1), generator=torch.Generator().manual_seed(1))
    return model, layers, batch


def test_structured_ld_is_unbiased_for_the_gauss_newton_form_along_the_actual_error():
    model, layers, batch = _model_and_batch()
    draws = 400
    got = structured_ld(model, layers, batch, draws)
    _, _, errors = fp4_output_errors(model, layers, batch)
    for name in ("model.layers.0.self_attn.v_proj", "model.layers.1.mlp.down_proj"):
        want = gauss_newton_along(model, layers[name], errors[name], batch)
        assert want > 0
        # one draw sums 4 independent per-sequence squares of roughly Gaussian terms: relative SD about
        # sqrt(2 / 4) = 0.7, so 0.035 over 400 draws; 0.2 is more than 5 standard errors
        assert got[name] == pytest.approx(want, rel=0.2)


def test_fp4_output_errors_leave_the_plan_and_the_sr_counters_as_they_were():
    model, layers, batch = _model_and_batch()
    layers["model.layers.0.mlp.up_proj"].set_precision("fp4")
    model.loss(batch)  # an FP4 layer's forward advances its SR counter
    precisions = {n: m.precision for n, m in layers.items()}
    counters = sr_counters(model)
    _, outputs, errors = fp4_output_errors(model, layers, batch)
    assert {n: m.precision for n, m in layers.items()} == precisions and sr_counters(model) == counters
    assert set(errors) == set(layers) and all(outputs[n].requires_grad for n in layers)
    assert all(errors[n].shape == outputs[n].shape and errors[n].abs().max() > 0 for n in layers)


def _stats() -> PlannerStats:
    errors = {"fp4": {"fprop": 0.01, "dgrad": 0.02, "wgrad": 0.03}}
    layers = tuple(LayerStats(LayerShape(f"l{i}", 16, 8, 32), out_rms=1.0, grad_out_rms=0.5, grad_in_rms=0.25,
                              weight_grad_rms=0.125, curvature=curvature, s_dgrad=3.0, s_wgrad=5.0, errors=errors)
                   for i, curvature in enumerate((2.0, 0.0)))
    return PlannerStats(layers=layers, loss=1.5, step=7)


def test_structured_ld_hooks_scale_each_curvature_by_structured_over_isotropic_ld(monkeypatch):
    seen = {}

    def fake_structured_ld(model, layers, batch, draws):
        seen.update(model=model, layers=layers, batch=batch)
        return {"l0": 0.06, "l1": 0.5}
    monkeypatch.setattr(fp4_forward, "structured_ld", fake_structured_ld)
    planner = SimpleNamespace(model="the model", layers="its layers", measure=lambda batch, *a, **k: _stats())
    hooks = SimpleNamespace(planner=planner, on_setup=lambda model, opt: None)
    StructuredLD(hooks).on_setup(model=None, opt=None)
    got = planner.measure("the batch").by_name()
    assert seen == {"model": "the model", "layers": "its layers", "batch": "the batch"}
    assert got["l0"].curvature == pytest.approx(2.0 * 0.06 / (2.0 * 0.01)) and got["l0"].ld("fp4") == pytest.approx(0.06)
    assert got["l1"].curvature == 0.0  # no isotropic LD to scale: left as measured
    assert (got["l0"].s_dgrad, got["l0"].s_wgrad, got["l0"].errors) == (3.0, 5.0, _stats().layers[0].errors)


def test_structured_ld_hooks_behave_as_the_hooks_they_wrap():
    steps, setups = [], []
    planner = SimpleNamespace(model=None, layers=None, measure=lambda batch: _stats())
    hooks = SimpleNamespace(planner=planner, plans=["a plan"], on_setup=lambda model, opt: setups.append(model),
                            on_step=lambda step, model, batch: steps.append(step) or "stepped")
    wrapped = StructuredLD(hooks)
    wrapped.on_setup(model="the model", opt=None)
    assert setups == ["the model"] and wrapped.on_step(3, None, None) == "stepped" and steps == [3]
    assert wrapped.plans == ["a plan"] and wrapped.planner is planner
