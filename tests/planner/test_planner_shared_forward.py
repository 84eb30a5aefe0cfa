"""The Fisher draws reuse the statistics pass's forward (stats.record's logits_of, divergence.measure): the same
statistics to the last bit as with a forward of their own, one model call fewer, and a graph kept only when the
loss calls the model once on exactly the window's inputs; the pass's gradient hooks do not fire again."""

import pytest
import torch
from torch.nn import functional as F

from causal_lm import CausalLM, trained_causal_lm
from planner import DivergenceConfig, PlannerConfig, StatsConfig
from planner.divergence import PlannedModel, lm_logits, measure
from planner.stats import record

CONFIG = dict(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=96, max_seq_len=16)
VOCAB = 48


def trained_lm():
    return trained_causal_lm(CONFIG, VOCAB)


def model_calls(model):
    """A list that grows by one per call of the model's forward, and the hook's handle."""
    calls = []
    return calls, model.register_forward_hook(lambda mod, args, out: calls.append(1))


def own_forward_logits(model, batch):
    """lm_logits under another name: measure does not know it is the loss's own model call."""
    return lm_logits(model, batch)


@pytest.mark.parametrize("wd_horizon", [None, 4])
def test_measure_shares_the_forward_and_its_statistics_are_the_same_to_the_last_bit(wd_horizon):
    """Every per-layer number, the loss and every diagnostic but the timings are bitwise those of the Fisher draws
    on a forward of their own; the model runs once fewer (the statistics pass, the WD forwards and no more)."""
    model, layers, opt, batch = trained_lm()
    config = DivergenceConfig(wd_horizon=wd_horizon)
    results = {}
    for logits_fn in (lm_logits, own_forward_logits):
        calls, handle = model_calls(model)
        try:
            stats = measure(PlannedModel(model, layers, opt, lambda m, b: m.loss(b), logits_fn), batch, ("fp8", "fp4"),
                            StatsConfig(), config)
        finally:
            handle.remove()
        results[logits_fn] = stats, len(calls)
    (shared, shared_calls), (own, own_calls) = results[lm_logits], results[own_forward_logits]
    assert shared.to_vector() == own.to_vector()
    untimed = {k: v for k, v in own.diagnostics.items() if not k.startswith("time_")}
    assert {k: shared.diagnostics[k] for k in untimed} == untimed
    assert shared_calls == own_calls - 1 == 1 + config.draws


def test_the_planners_default_measurement_shares_the_forward():
    """SnipPlanner's default (the default loss of a causal LM, lm_logits, the Fisher curvature)."""
    from planner import SnipPlanner
    model, layers, opt, batch = trained_lm()
    planner = SnipPlanner(model, opt, PlannerConfig(interval=4))
    calls, handle = model_calls(model)
    try:
        planner.measure(batch, step=3)
    finally:
        handle.remove()
    assert len(calls) == 1 + planner.config.divergence.draws  # the statistics pass and the WD forwards


def test_record_keeps_the_logits_and_layer_outputs_of_the_loss_call():
    """The kept logits are lm_logits' values; the outputs are the layers'; backpropagating through them again
    leaves the recording as the pass made it (its gradient hooks are gone)."""
    model, layers, opt, batch = trained_lm()
    rec = record(model, layers, batch, lambda m, b: m.loss(b), opt, StatsConfig(), sequence_grads=True,
                 logits_of=batch[:, :-1])
    graph = rec.logits_graph
    assert graph is not None and set(graph.outputs) == set(layers)
    with torch.no_grad():
        assert torch.equal(graph.logits, lm_logits(model, batch))
    before = {n: (r.dy.clone(), r.grad_out_rms, r.sequence_grad_sq) for n, r in rec.layers.items()}
    torch.autograd.grad(graph.logits.pow(2).sum(), list(graph.outputs.values()))
    for n, r in rec.layers.items():
        assert torch.equal(r.dy, before[n][0]) and (r.grad_out_rms, r.sequence_grad_sq) == before[n][1:]


def test_record_without_logits_of_keeps_no_graph():
    model, layers, opt, batch = trained_lm()
    assert record(model, layers, batch, lambda m, b: m.loss(b), opt, StatsConfig()).logits_graph is None


def lm_loss_bypassing_the_call(model, window):
    """The model's loss with its forward run directly, not through the module's call (no hook sees it)."""
    logits = CausalLM.forward(model, window[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))


@pytest.mark.parametrize("loss", ["other_inputs", "no_call_of_the_model"])
def test_record_keeps_no_graph_unless_the_loss_calls_the_model_on_those_inputs(loss):
    """A loss of the model on other inputs of the same shape (the batch's sequences in reverse order), and a loss
    that never calls the model module, give no graph: the Fisher draws then make a forward of their own."""
    model, layers, opt, batch = trained_lm()
    losses = {"other_inputs": lambda m, b: m.loss(b.flip(0)), "no_call_of_the_model": lm_loss_bypassing_the_call}
    rec = record(model, layers, batch, losses[loss], opt, StatsConfig(), logits_of=batch[:, :-1])
    assert rec.logits_graph is None
