"""Adam's signal share (divergence.py): the statistics pass's per-sequence gradient norms against autograd per
sequence, both of sequence_grad_sq's paths, the signal fraction as the mean over pairs of sequences' gradient dot
products (unbiased for ||mu||^2), one WD-weighted factor clipped to [0, 1], and measure() scaling wgrad's WD by it
and nothing else; layouts it cannot read warn and keep WD's price."""

import pytest
import torch
from torch import nn

from causal_lm import CausalLM, trained_causal_lm
from planner import DivergenceConfig, PlannerConfig, SnipPlanner, StatsConfig
from planner import divergence
from planner.divergence import PlannedModel, measure, signal_fractions, weighted_signal_share
from planner.stats import record, sequence_grad_sq
from snip_ops import SnipLinear, convert

CONFIG = dict(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=96, max_seq_len=16)
VOCAB = 48


def loss_fn(model, batch):
    return model.loss(batch)


def trained_lm():
    return trained_causal_lm(CONFIG, VOCAB)


def per_sequence_grads(model, layers, batch) -> dict[str, list[torch.Tensor]]:
    """{layer: [dW of sequence s's own mean loss]} by autograd, one backward per sequence (float64)."""
    weights = [m.weight for m in layers.values()]
    out = {n: [] for n in layers}
    for s in range(batch.shape[0]):
        for n, g in zip(layers, torch.autograd.grad(model.loss(batch[s:s + 1]), weights)):
            out[n].append(g.double())
    return out


@pytest.mark.parametrize("shape", [(3, 5, 7, 11), (4, 9, 2, 3), (2, 3, 4, 40, 33)])
@pytest.mark.parametrize("cap", [1, 2**20])
def test_sequence_grad_sq_is_the_sum_of_the_sequences_squared_products(shape, cap):
    """(S, T, K, N) = (3, 5, 7, 11) takes the Gram path (T (K + N) < K N), (4, 9, 2, 3) the products; the last
    has two middle dimensions (rows 3 x 4 per sequence). A 1-byte cap computes one sequence at a time. float32
    products of at most 12 x 40 terms: within 1e-5 of the float64 sum."""
    *lead, k, n = shape
    gen = torch.Generator().manual_seed(sum(shape))
    x, dy = torch.randn(*lead, k, generator=gen), torch.randn(*lead, n, generator=gen)
    flat_x, flat_dy = x.double().reshape(lead[0], -1, k), dy.double().reshape(lead[0], -1, n)
    want = sum(float((flat_dy[s].T @ flat_x[s]).pow(2).sum()) for s in range(lead[0]))
    assert sequence_grad_sq(x, dy, cap) == pytest.approx(want, rel=1e-5)


def test_sequence_grad_sq_refuses_operands_of_different_rows():
    with pytest.raises(ValueError, match="leading dimensions"):
        sequence_grad_sq(torch.ones(2, 3, 4), torch.ones(3, 2, 4), 2**20)


def test_record_measures_each_sequences_share_of_the_weight_gradient():
    """Sequences of a causal LM do not interact, so sequence s's share of the batch loss's dW is its own mean
    loss's gradient over S: sum_s ||dW_s||^2 agrees with autograd per sequence (float32 passes, rel 1e-4)."""
    model, layers, opt, batch = trained_lm()
    rec = record(model, layers, batch, loss_fn, opt, StatsConfig(max_rows=16), sequence_grads=True)
    assert rec.sequences == batch.shape[0]
    grads = per_sequence_grads(model, layers, batch)
    for name, r in rec.layers.items():
        want = sum(float(g.pow(2).sum()) for g in grads[name]) / batch.shape[0] ** 2
        assert r.sequence_grad_sq == pytest.approx(want, rel=1e-4), name
    assert record(model, layers, batch, loss_fn, opt, StatsConfig(max_rows=16)).sequences is None  # not asked


def test_signal_fraction_is_the_mean_over_pairs_of_sequences_gradient_dots_over_adams_next_second_moment():
    model, layers, opt, batch = trained_lm()
    rec = record(model, layers, batch, loss_fn, opt, StatsConfig(max_rows=16), sequence_grads=True)
    fractions = signal_fractions(rec, layers)
    grads = per_sequence_grads(model, layers, batch)
    b1, b2 = opt.param_groups[0]["betas"]
    for name, module in layers.items():
        g_s = grads[name]
        pairs = [float((g_s[a] * g_s[b]).sum()) for a in range(len(g_s)) for b in range(len(g_s)) if a != b]
        state = opt.state[module.weight]
        t = float(state["step"]) + 1  # the next update's v_hat takes this batch's gradient in
        g = rec.grads[module.weight].double()
        v_hat = (b2 * state["exp_avg_sq"].double() + (1 - b2) * g * g) / (1 - b2 ** t)
        assert fractions[name] == pytest.approx(sum(pairs) / len(pairs) / float(v_hat.sum()), rel=1e-3, abs=1e-6)


def test_the_signal_estimate_is_unbiased_for_the_expected_gradients_square():
    """A linear layer summed over 6 rows per sequence, inputs mu + noise (noise 10x mu per entry): the numerator
    f_l sum(v_hat) averages to ||6 mu||^2 over 300 batches (within 4 standard errors), where ||dW||^2 of the same
    batches reads mostly noise."""
    layer = nn.Linear(16, 1, bias=False)
    layers = {"dot": layer}
    mu = torch.full((16,), 0.1)
    gen = torch.Generator().manual_seed(1)
    signal, plain = [], []
    for _ in range(300):
        batch = mu + torch.randn(8, 6, 16, generator=gen)
        rec = record(layer, layers, batch, lambda m, x: m(x).sum() / x.shape[0], None, StatsConfig(max_rows=16),
                     sequence_grads=True)
        v = rec.preconditioner.second_moment_sum[layer.weight]
        signal.append(signal_fractions(rec, layers)["dot"] * v)
        plain.append(float(rec.layers["dot"].weight_grad.double().pow(2).sum()))
    signal = torch.tensor(signal, dtype=torch.float64)
    want = float((6 * mu).pow(2).sum())
    assert abs(float(signal.mean()) - want) < 4 * float(signal.std()) / 300 ** 0.5
    assert sum(plain) / len(plain) > 2 * want


def test_weighted_signal_share_weighs_layers_by_their_wgrad_price_and_clips():
    errors = {"a": {"fp8": {"wgrad": 0.01}, "fp4": {"wgrad": 0.04}}, "b": {"fp8": {"wgrad": 0.02}, "fp4": {"wgrad": 0.01}}}
    s_wgrad = {"a": 2.0, "b": 3.0}
    weights = {"a": 2.0 * 0.04, "b": 3.0 * 0.02}  # s_wgrad x the largest wgrad error
    want = (weights["a"] * 0.5 + weights["b"] * 0.1) / sum(weights.values())
    assert weighted_signal_share({"a": 0.5, "b": 0.1}, s_wgrad, errors) == pytest.approx(want, rel=1e-12)
    assert weighted_signal_share({"a": 3.0, "b": 2.0}, s_wgrad, errors) == 1.0
    assert weighted_signal_share({"a": -0.5, "b": 0.1}, s_wgrad, errors) == 0.0
    assert weighted_signal_share({"a": 0.3}, {"a": 0.0}, errors) == 1.0  # no wgrad priced: WD as it is


def test_measure_scales_wgrad_wd_by_the_share_and_nothing_else(monkeypatch):
    model, layers, opt, batch = trained_lm()
    kw = dict(planned=PlannedModel(model, layers, opt, loss_fn), batch=batch, candidates=("fp8", "fp4"),
              stats_config=StatsConfig(max_rows=16), config=DivergenceConfig(wd_horizon=10))
    with_share = measure(**kw)
    with monkeypatch.context() as m:
        m.setattr(divergence, "_signal_share", lambda *args: None)  # as where the share cannot be measured
        without = measure(**kw)
    share = with_share.diagnostics["wgrad_signal_share"]
    assert 0 < share < 1 and "wgrad_signal_share" not in without.diagnostics
    rec = record(model, layers, batch, loss_fn, opt, StatsConfig(max_rows=16), sequence_grads=True)
    assert share == pytest.approx(weighted_signal_share(
        signal_fractions(rec, layers), {s.name: s.s_wgrad for s in without.layers},
        {s.name: s.errors for s in without.layers}), rel=1e-9)
    for a, b in zip(with_share.layers, without.layers):
        assert a.s_wgrad == pytest.approx(b.s_wgrad * share, rel=1e-12)
        assert (a.curvature, a.s_dgrad, a.errors, a.out_rms) == (b.curvature, b.s_dgrad, b.errors, b.out_rms)


def test_the_planner_reports_the_share_of_every_replan():
    model, layers, opt, batch = trained_lm()
    planner = SnipPlanner(model, opt, PlannerConfig(interval=5), filter_fn=lambda m, n: True)
    planner.replan(batch, step=0)
    assert 0 <= planner.history[-1]["wgrad_signal_share"] <= 1


class FlatLM(nn.Module):
    """Two linears on the rows of all sequences flattened to [S * T, K]: no sequence layout to read."""

    def __init__(self):
        super().__init__()
        self.up, self.down = SnipLinear(8, 16), SnipLinear(16, 1)

    def loss(self, batch):
        return self.down(torch.tanh(self.up(batch.reshape(-1, 8)))).pow(2).mean()


@pytest.mark.parametrize("sequences", [1, 4])
def test_a_batch_without_a_sequence_layout_keeps_wgrads_price_and_warns(sequences):
    """FlatLM's layers see [S * T, K]; a single sequence has no spread to measure. Either way WD is unscaled."""
    torch.manual_seed(0)
    model = FlatLM() if sequences > 1 else convert(CausalLM.build(**CONFIG, vocab_size=VOCAB))
    layers = {n: m for n, m in model.named_modules() if isinstance(m, SnipLinear)}
    batch = torch.randn(4, 6, 8) if sequences > 1 else torch.randint(0, VOCAB, (1, 13))
    with pytest.warns(UserWarning, match="keeps its price"):
        shared = measure(PlannedModel(model, layers, None, loss_fn), batch, ("fp4",), StatsConfig(max_rows=16),
                         DivergenceConfig(method="batched"))
    assert "wgrad_signal_share" not in shared.diagnostics
    rec = record(model, layers, batch, loss_fn, None, StatsConfig(max_rows=16), sequence_grads=True)
    weights = rec.preconditioner.excess_loss_weight
    assert [s.s_wgrad for s in shared.layers] == [  # the settled price, unscaled (divergence.weight_sensitivity)
        float(rec.layers[n].weight_grad.pow(2).mean() * weights[layer.weight].sum()) for n, layer in layers.items()]
    with pytest.raises(ValueError, match="per-sequence gradients"):
        signal_fractions(rec, layers)
