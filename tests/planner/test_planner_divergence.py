"""Statistics and divergences on a real (tiny) Llama: zero for bf16, fp8 < fp4, deterministic,
batched estimators agree with the per-layer definitions, and the model is left untouched."""

import copy
import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from bounds import assert_within, gamma, gemm_error_bound, relative_frobenius, unit_roundoff
from causal_lm import CausalLM
from planner.divergence import DivergenceConfig, PlannedModel, _sample, lm_logits, measure
from planner.qerror import gemm_errors, relative_error
from planner.stats import StatsConfig, adam_preconditioner, gradient_variance
from snip_ops import SnipLinear, convert, gemm
from snip_ops.formats import recipe

CONFIG = dict(dim=128, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=32)
CANDIDATES = ("bf16", "fp8", "fp4")


pytestmark = pytest.mark.usefixtures("one_thread")


def loss_fn(model, batch):
    return model.loss(batch)


def trained_tiny(steps: int = 4):
    """A tiny Llama after a few AdamW steps (so the optimizer has state), its optimizer and a batch."""
    torch.manual_seed(0)
    model = convert(CausalLM.build(**CONFIG))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        model.loss(torch.randint(0, 64, (4, 33), generator=gen)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, SnipLinear)}
    return model, opt, layers, torch.randint(0, 64, (4, 33), generator=gen)


def unshared_wgrad(stats) -> dict[str, float]:
    """{layer: s_wgrad} before Adam's signal share (divergence.py), which scales every layer's by one factor."""
    share = stats.diagnostics["wgrad_signal_share"]
    assert share > 0
    return {s.name: s.s_wgrad / share for s in stats.layers}


@pytest.fixture(scope="module")
def measured():
    model, opt, layers, batch = trained_tiny()
    return measure(PlannedModel(model, layers, opt, loss_fn), batch, CANDIDATES, StatsConfig(max_rows=128),
                   DivergenceConfig(draws=2))


def test_divergences_are_zero_for_bf16_and_grow_as_precision_drops(measured):
    assert len(measured.layers) == 7
    assert "no Adam state" not in measured.preconditioner
    for s in measured.layers:
        assert s.ld("bf16") == 0.0 and s.wd("bf16") == 0.0
        for g in ("fprop", "dgrad", "wgrad"):
            assert 0 < s.errors["fp8"][g] < s.errors["fp4"][g], (s.name, g)
        assert 0 < s.wd("fp8") < s.wd("fp4"), s.name
        assert s.s_dgrad > 0 and s.s_wgrad > 0
        if s.curvature > 0:
            assert 0 < s.ld("fp8") < s.ld("fp4"), s.name
    assert sum(s.curvature for s in measured.layers) > 0
    # Relative FP4 GEMM errors of Gaussian-like data are of order 1e-2 (here 0.0028 to 0.023: quantization
    # errors fixed by the seeds, each limit a factor > 2.8 away); FP8 ones ~1e-3 or below.
    e4 = [s.errors["fp4"]["fprop"] for s in measured.layers]
    assert 1e-3 < min(e4) and max(e4) < 0.1


def test_measurement_is_deterministic(measured):
    model, opt, layers, batch = trained_tiny()
    again = measure(PlannedModel(model, layers, opt, loss_fn), batch, CANDIDATES, StatsConfig(max_rows=128),
                    DivergenceConfig(draws=2))
    assert again.layers == measured.layers
    assert again.loss == measured.loss


def test_measurement_leaves_the_model_untouched():
    model, opt, layers, batch = trained_tiny()
    layers["model.layers.0.mlp.up_proj"].set_precision("fp4")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    measure(PlannedModel(model, layers, opt, loss_fn), batch, ("fp8",), StatsConfig(max_rows=64), DivergenceConfig(draws=1))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(rng, torch.get_rng_state())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert str(layers["model.layers.0.mlp.up_proj"].precision) == "fp4"
    assert str(layers["model.layers.0.mlp.down_proj"].precision) == "bf16"


def test_batched_estimators_agree_with_the_per_layer_definitions():
    model, opt, layers, batch = trained_tiny()
    kw = dict(planned=PlannedModel(model, layers, opt, loss_fn), batch=batch, candidates=("fp4",),
              stats_config=StatsConfig(max_rows=64))
    # Both methods are Monte Carlo estimators of the same per-layer numbers (s_dgrad: unbiased estimators
    # of rms(dx)^2 tr(J C J^T); curvature: h_l up to O(sigma^2), sigma = 0.2 keeping the loss
    # differences above float32 noise). Their means over independent seeds must agree within 6
    # standard errors of the difference, taken from the spread over the seeds.
    seeds = range(10)
    batched = [measure(**kw, config=DivergenceConfig(draws=4, method="batched", seed=s)) for s in seeds]
    exact = [measure(**kw, config=DivergenceConfig(draws=4, method="per_layer", sigma=0.2, seed=s)) for s in seeds]
    for field in ("s_dgrad", "curvature"):
        b, e = (torch.tensor([[getattr(s, field) for s in m.layers] for m in runs], dtype=torch.float64)
                for runs in (batched, exact))
        standard_error = (b.var(0) / len(seeds) + e.var(0) / len(seeds)).sqrt()
        assert ((b.mean(0) - e.mean(0)).abs() < 6 * standard_error).all(), (field, b.mean(0), e.mean(0))
    for b, e in zip(batched[0].layers, exact[0].layers):
        assert b.s_wgrad == e.s_wgrad  # closed form in both
    # The loss values of a batched pair measure the sum over layers independently: n^T H n both ways,
    # equal up to O(sigma^2) (within 1e-3 of each other over seeds 0-5).
    for m in batched:
        d = m.diagnostics
        assert d["curvature_sum"] == pytest.approx(d["curvature_sum_from_loss_differences"], rel=0.01)


def test_step_zero_uses_the_gradient_second_moment():
    torch.manual_seed(0)
    model = convert(CausalLM.build(**CONFIG))
    opt = torch.optim.AdamW(model.parameters())
    layers = {n: m for n, m in model.named_modules() if isinstance(m, SnipLinear)}
    stats = measure(PlannedModel(model, layers, opt, loss_fn), torch.randint(0, 64, (2, 33)), ("fp8",),
                    StatsConfig(max_rows=32), DivergenceConfig(draws=1))
    assert "no Adam state" in stats.preconditioner
    assert all(s.s_wgrad > 0 for s in stats.layers)


def test_adam_preconditioner_matches_the_next_adamw_update():
    """excess_loss_weight = lr / (4 D) with D = sqrt(v_hat) + eps, and second_moment_sum = sum(v_hat), of the
    update torch's AdamW takes next with gradient g (its second moment read back from a float64 step)."""
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5, 3))
    b1, b2, eps, lr = 0.9, 0.95, 1e-8, 1e-2
    opt = torch.optim.AdamW([p], lr=lr, weight_decay=0.0, betas=(b1, b2), eps=eps)
    for _ in range(3):
        p.grad = torch.randn(5, 3)
        opt.step()
    g = torch.randn(5, 3)
    q = torch.nn.Parameter(p.detach().double().clone())
    o = torch.optim.AdamW([q], lr=lr, weight_decay=0.0, betas=(b1, b2), eps=eps)
    o.load_state_dict(copy.deepcopy(opt.state_dict()))  # the moments become float64 (exactly)
    q.grad = g.double()
    o.step()
    v_hat = o.state[q]["exp_avg_sq"] / (1 - b2**4)  # the next update is the optimizer's 4th
    pre = adam_preconditioner(opt, {p: g})
    # In float32: v_hat = (b2 v + (1 - b2) g^2) / bc2 within 5u (positive terms), D = sqrt(v_hat) + eps within
    # 2.5u + 1u + 1u, lr / 4 / D within 2u more; the float64 side's roundings are far below. 16u covers all.
    u = unit_roundoff(torch.float32)
    want = lr / 4 / (v_hat.sqrt() + eps)
    assert_within(pre.excess_loss_weight[p].double(), want, 16 * u * want, "excess-loss weight")
    assert abs(pre.second_moment_sum[p] - float(v_hat.sum())) <= 16 * u * float(v_hat.sum())
    assert pre.source == "adam state (exp_avg, exp_avg_sq)"


def test_memory_cap_bounds_the_row_sample():
    model, opt, layers, batch = trained_tiny(steps=1)
    per_row = 4 * sum(m.in_features + m.out_features for m in layers.values())
    assert StatsConfig(max_rows=256, memory_cap_bytes=10**9).rows_per_layer(layers) == 256
    assert StatsConfig(max_rows=256, memory_cap_bytes=40 * per_row).rows_per_layer(layers) == 40
    with pytest.raises(ValueError, match="at least 16 are needed"):
        StatsConfig(memory_cap_bytes=per_row).rows_per_layer(layers)
    with pytest.raises(ValueError, match="sigma"):
        DivergenceConfig(sigma=0.0)
    assert dataclasses.replace(DivergenceConfig(), method="per_layer").method == "per_layer"


@pytest.mark.parametrize("name", ["fp8", "fp4", "nvfp4", "mxfp4", "fp8_e5m2grad"])
def test_quantization_errors_are_those_of_the_emulated_gemms(name, monkeypatch):
    """gemm_errors (which reuses Q(w) for Q(w^T) where that is exact) equals the relative errors of
    snip_ops.gemm's emulated fprop / dgrad / wgrad under the same seed, odd shapes included. Both sides'
    GEMMs run in FP64 (the products of float32 values exact), so the comparison sees the quantized
    operands, not a BLAS's summation order."""
    products = []

    def fp64_mm(a, b):
        products.append((a, b))
        return a.double() @ b.double()

    monkeypatch.setattr(gemm, "fp32_mm", fp64_mm)
    gen = torch.Generator().manual_seed(2)
    x, dy, w = torch.randn(77, 300, generator=gen), torch.randn(77, 130, generator=gen), torch.randn(130, 300, generator=gen)
    r = recipe(name)
    approx = {"fprop": gemm.fprop(x, w, r, seed=4, emulate=True, out_dtype=torch.float64),
              "dgrad": gemm.dgrad(dy, w, r, seed=4, emulate=True, out_dtype=torch.float64),
              "wgrad": gemm.wgrad(dy, x, r, seed=4, emulate=True)}
    operands = dict(zip(approx, products))
    exact = {"fprop": gemm.fp32_mm(x, w.t()), "dgrad": gemm.fp32_mm(dy, w), "wgrad": gemm.fp32_mm(dy.t(), x)}
    # every row sampled and dW the exact product: e_wgrad is the relative error of the sample's wgrad
    rec = SimpleNamespace(x=x, dy=dy, weight=w, rows=torch.arange(77), shape=SimpleNamespace(tokens=77),
                          weight_grad=exact["wgrad"])
    got = gemm_errors(rec, (name, "bf16"), seed=4)
    assert got["bf16"] == {"fprop": 0.0, "dgrad": 0.0, "wgrad": 0.0}
    for g, y in approx.items():
        want = relative_error(y, exact[g])
        # sqrt(error) = ||approx - exact|| / ||exact||, the exact products computed alike on both sides:
        # two FP64 GEMMs of the same operands differ by <= 2 gamma_K(float64) |a| |b|, and each
        # relative_error sums its N squares in float64 (gamma_{N+2} of itself).
        a, b = operands[g]
        slack = 2 * relative_frobenius(gemm_error_bound(a, b.t(), torch.float64), exact[g])
        slack += 2 * math.sqrt(want) * gamma(y.numel() + 2, torch.float64)
        assert abs(math.sqrt(got[name][g]) - math.sqrt(want)) <= slack, g
        assert got[name][g] > 0
    # wgrad's operands are the emulated GEMM's bit for bit (the native quantizer where there is one, the
    # reference there) and both multiply them with the same FP64 product: the same error to the last bit
    assert got[name]["wgrad"] == relative_error(approx["wgrad"], exact["wgrad"])


def test_fisher_curvature_is_the_gauss_newton_trace():
    """h_l = rms(y_l)^2 tr(G_ll) / 2 with G the Gauss-Newton matrix of the mean cross-entropy, computed
    exactly by enumerating every label at every position: tr(G_ll) = sum_t sum_v p_tv ||d l_t(v)/d y_l||^2 / N.
    The Monte Carlo means over 12 seeds agree with it within 6 standard errors, and every estimate is >= 0."""
    torch.manual_seed(0)
    model = convert(CausalLM.build(**CONFIG, vocab_size=24))
    layers = {n: m for n, m in model.named_modules() if isinstance(m, SnipLinear)}
    opt = torch.optim.AdamW(model.parameters())
    batch = torch.randint(0, 24, (2, 4), generator=torch.Generator().manual_seed(3))
    kw = dict(planned=PlannedModel(model, layers, opt, loss_fn, lm_logits), batch=batch, candidates=("fp8",),
              stats_config=StatsConfig(max_rows=16))
    runs = [measure(**kw, config=DivergenceConfig(method="fisher", draws=8, seed=s)) for s in range(12)]
    assert all(s.curvature >= 0 for m in runs for s in m.layers)
    assert all(m.diagnostics["ld_fisher"] == 1.0 for m in runs)
    outputs = {}
    handles = [m.register_forward_hook(lambda mod, a, out, n=n: outputs.__setitem__(n, out)) for n, m in layers.items()]
    try:
        logits = lm_logits(model, batch).reshape(-1, 24).float()
    finally:
        for h in handles:
            h.remove()
    probs, positions = logits.detach().softmax(-1).double(), logits.shape[0]
    trace = {n: 0.0 for n in layers}
    for t in range(positions):
        for v in range(24):
            grads = torch.autograd.grad(-logits[t].log_softmax(-1)[v], list(outputs.values()), retain_graph=True)
            for n, g in zip(outputs, grads):
                trace[n] += float(probs[t, v]) * float(g.double().pow(2).sum()) / positions
    exact = torch.tensor([runs[0].by_name()[n].out_rms ** 2 * trace[n] / 2 for n in layers], dtype=torch.float64)
    est = torch.tensor([[m.by_name()[n].curvature for n in layers] for m in runs], dtype=torch.float64)
    standard_error = (est.var(0) / len(runs)).sqrt()
    assert ((est.mean(0) - exact).abs() < 6 * standard_error).all(), (est.mean(0), exact)


def test_fisher_labels_follow_the_model_and_never_a_class_of_zero_mass():
    """The inverse-CDF draws: each class's frequency over 40000 draws within 6 standard errors of its
    probability; classes of zero mass (also the last, and rows of one class) never drawn."""
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.0, 0.0, 0.0, 1.0], [0.25, 0.25, 0.25, 0.25], [0.5, 0.5, 0.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros_like(probs, dtype=torch.float64)
    draws = 40000
    for _ in range(draws // 100):
        labels = _sample(probs.repeat(100, 1), gen).view(100, 4)
        counts += F.one_hot(labels, 4).sum(0).double()
    freq = counts / draws
    standard_error = (probs.double() * (1 - probs.double()) / draws).sqrt()
    assert ((freq - probs.double()).abs() <= 6 * standard_error).all(), freq
    assert (counts[probs == 0] == 0).all()


def test_loss_unit_wd_is_the_stationary_excess_loss_weight():
    """s_wgrad = rms(dW)^2 sum lr / (4 (sqrt(v_hat) + eps)) exactly (times Adam's signal share, which does not
    depend on lr); doubling lr doubles both sensitivities (s_dgrad up to the O(h) nonlinearity of its finite
    difference)."""
    model, opt, layers, batch = trained_tiny()
    kw = dict(planned=PlannedModel(model, layers, opt, loss_fn), batch=batch, candidates=("fp4",),
              stats_config=StatsConfig(max_rows=64), config=DivergenceConfig(draws=1, method="batched"))
    base = measure(**kw)
    for group in opt.param_groups:
        group["lr"] *= 2
    doubled = measure(**kw)
    for a, b in zip(base.layers, doubled.layers):
        assert b.s_wgrad == 2 * a.s_wgrad
        assert b.s_dgrad == pytest.approx(2 * a.s_dgrad, rel=1e-3)


def test_horizon_wd_is_the_excess_loss_reached_within_the_horizon():
    """With wd_horizon T, s_wgrad = rms(dW)^2 sum c_i (1 - exp(-8 T c_i G_ii)): at most the settled value, the
    settled value for T -> infinity, 8 T rms(dW)^2 sum c_i^2 G_ii for small T. That last form checks the
    Gauss-Newton diagonal against its exact value, enumerating every label at every position: the Monte Carlo
    means over 12 seeds agree within 6 standard errors. LD is unchanged."""
    torch.manual_seed(0)
    model = convert(CausalLM.build(**CONFIG, vocab_size=24))
    layers = {n: m for n, m in model.named_modules() if isinstance(m, SnipLinear)}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        model.loss(torch.randint(0, 24, (2, 5), generator=gen)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    batch = torch.randint(0, 24, (2, 5), generator=gen)
    kw = dict(planned=PlannedModel(model, layers, opt, loss_fn, lm_logits), batch=batch, candidates=("fp4",),
              stats_config=StatsConfig(max_rows=16))
    plain = DivergenceConfig(draws=2)
    settled = measure(**kw, config=plain)
    long = measure(**kw, config=dataclasses.replace(plain, wd_horizon=10**12))
    short = [measure(**kw, config=dataclasses.replace(plain, draws=8, wd_horizon=1, seed=s)) for s in range(12)]
    for a, b in zip(unshared_wgrad(settled).values(), unshared_wgrad(long).values()):
        assert b == pytest.approx(a, rel=1e-6)
    for a, b in zip(settled.layers, long.layers):
        assert b.curvature == a.curvature
    for m in short:
        for a, b in zip(unshared_wgrad(settled).values(), unshared_wgrad(m).values()):
            assert 0 < b < a
        assert all(s.s_dgrad > 0 and s.curvature > 0 for s in m.layers)

    params = [p for p in model.parameters() if p.requires_grad]
    grads = dict(zip(params, torch.autograd.grad(model.loss(batch), params)))
    c = adam_preconditioner(opt, grads).excess_loss_weight
    logits = lm_logits(model, batch).reshape(-1, 24).float()
    probs, positions = logits.detach().softmax(-1).double(), logits.shape[0]
    weights = [m.weight for m in layers.values()]
    exact = [torch.zeros_like(w, dtype=torch.float64) for w in weights]
    for t in range(positions):
        for v in range(24):
            gs = torch.autograd.grad(-logits[t].log_softmax(-1)[v], weights, retain_graph=True)
            for e, g in zip(exact, gs):
                e += float(probs[t, v]) * g.double().pow(2) / positions  # G_ii of the mean loss over positions
    rms2 = {s.name: s.weight_grad_rms ** 2 for s in settled.layers}
    want = torch.tensor([8 * rms2[n] * float((c[w].double().pow(2) * e).sum()) for n, w, e in
                         zip(layers, weights, exact)])
    # (1 - exp(-x)) = x - x^2/2 + ...: the second-order term is far below the Monte Carlo noise at T = 1
    est = torch.tensor([[unshared_wgrad(m)[n] for n in layers] for m in short], dtype=torch.float64)
    standard_error = (est.var(0) / len(short)).sqrt()
    assert ((est.mean(0) - want).abs() < 6 * standard_error).all(), (est.mean(0), want)


def test_horizon_wd_follows_the_learning_rate_schedule():
    """lr_ratios all 1 is the constant-rate horizon (to the table's interpolation); a decay lowers every layer's
    WD and leaves LD alone; no step after this one (the run ends) prices no noise at all."""
    model, opt, layers, batch = trained_tiny()
    kw = dict(planned=PlannedModel(model, layers, opt, loss_fn, lm_logits), batch=batch, candidates=("fp4",),
              stats_config=StatsConfig(max_rows=64), config=DivergenceConfig(draws=2, wd_horizon=10))
    constant = measure(**kw)
    ones = measure(**kw, lr_ratios=[1.0] * 10)
    decay = measure(**kw, lr_ratios=[1 - 0.09 * t for t in range(10)])
    ended = measure(**kw, lr_ratios=[0.0] * 10)
    for c, o, d, e in zip(constant.layers, ones.layers, decay.layers, ended.layers):
        assert o.s_wgrad == pytest.approx(c.s_wgrad, rel=1e-3) and o.s_dgrad == pytest.approx(c.s_dgrad, rel=1e-3)
        assert 0 < d.s_wgrad < c.s_wgrad and 0 < d.s_dgrad < c.s_dgrad
        assert e.s_wgrad == 0 and e.s_dgrad == 0
        assert c.curvature == o.curvature == d.curvature == e.curvature
    with pytest.raises(ValueError, match="lr_ratios has 3 steps, the horizon 10"):
        measure(**kw, lr_ratios=[1.0] * 3)
    with pytest.raises(ValueError, match="set DivergenceConfig.wd_horizon"):
        measure(**{**kw, "config": DivergenceConfig(draws=2)}, lr_ratios=[1.0] * 10)


def test_horizon_wd_needs_a_horizon_and_a_batch_to_halve_without_logits():
    with pytest.raises(ValueError, match="wd_horizon must be"):
        DivergenceConfig(wd_horizon=0)
    model, opt, layers, batch = trained_tiny(1)
    with pytest.raises(ValueError, match=">= 2 rows in every tensor"):
        measure(PlannedModel(model, layers, opt, loss_fn), batch[:1], ("fp4",), StatsConfig(max_rows=16),
                DivergenceConfig(wd_horizon=10))


@pytest.mark.parametrize("removed", [{"ld_form": "directional"}, {"wd_units": "update"},
                                     {"wgrad_signal_share": False}])
def test_removed_divergence_options_are_refused(removed):
    """LD is isotropic, WD an excess loss and Adam's signal share always applies: the options that chose otherwise
    are gone, and passing one fails."""
    with pytest.raises(TypeError, match=next(iter(removed))):
        DivergenceConfig(**removed)


def test_horizon_wd_without_logits_reads_the_gauss_newton_diagonal_from_the_gradient_variance():
    """Without the Fisher draws, G_ii = N Var(g_i), Var from the half batch (stats.gradient_variance) and N the
    linear layers' rows: s_wgrad = rms(dW)^2 sum c_i (1 - exp(-8 T c_i N Var_i)), recomputed here from the
    gradients of the whole and the first half batch; LD and s_dgrad's curvature pass are unchanged."""
    model, opt, layers, batch = trained_tiny()
    kw = dict(planned=PlannedModel(model, layers, opt, loss_fn), batch=batch, candidates=("fp4",),
              stats_config=StatsConfig(max_rows=64))
    settled = measure(**kw, config=DivergenceConfig(draws=1))
    horizon = measure(**kw, config=DivergenceConfig(draws=1, wd_horizon=20))
    params = [p for p in model.parameters() if p.requires_grad]
    full = torch.autograd.grad(model.loss(batch), params)
    half = torch.autograd.grad(model.loss(batch[:2]), params)
    c = adam_preconditioner(opt, dict(zip(params, full))).excess_loss_weight
    rows = batch.shape[0] * (batch.shape[1] - 1)
    settled_wgrad, horizon_wgrad = unshared_wgrad(settled), unshared_wgrad(horizon)
    for (name, layer), a, b in zip(layers.items(), settled.layers, horizon.layers):
        i = next(i for i, p in enumerate(params) if p is layer.weight)
        gn = rows * (half[i] - full[i]).float().pow(2)  # halves of equal size: n_a / n_b = 1
        want = b.weight_grad_rms ** 2 * float((c[layer.weight] * -torch.expm1(-8 * 20 * c[layer.weight] * gn)).sum())
        assert horizon_wgrad[name] == pytest.approx(want, rel=1e-4), name
        assert horizon_wgrad[name] < settled_wgrad[name] and b.curvature == a.curvature
    assert "time_gradient_variance_s" in horizon.diagnostics


def test_gradient_variance_is_the_gauss_newton_diagonal_when_labels_follow_the_model():
    """For independent rows whose labels are drawn from the model's own prediction, E[N Var_est(g_i)] is the
    Gauss-Newton (= Fisher) diagonal of the mean cross-entropy, for halves of unequal size too (N = 15 rows):
    the mean over 400 draws of rows and labels of N Var_est - G_exact (G enumerated over every label of every
    row) is within 6 standard errors of 0 for every weight entry and for their sum."""
    torch.manual_seed(0)
    layer = nn.Linear(5, 4)
    gen = torch.Generator().manual_seed(1)
    n, diffs = 15, []
    for _ in range(400):
        x = torch.randn(n, 5, generator=gen)
        probs = layer(x).detach().softmax(-1)
        labels = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        batch = torch.cat([x, labels[:, None].float()], 1)

        def ce(model, b):
            return F.cross_entropy(model(b[:, :5]), b[:, 5].long())

        grads = dict(zip((layer.weight,), torch.autograd.grad(ce(layer, batch), [layer.weight])))
        var = gradient_variance(layer, {"l": layer}, batch, ce, SimpleNamespace(grads=grads), seed=0)[layer.weight]
        exact = torch.zeros_like(layer.weight)
        for r in range(n):
            for v in range(4):  # d CE(row r, label v) / dW = (p_r - e_v) x_r^T, mean over rows of its square
                g = torch.outer(probs[r] - F.one_hot(torch.tensor(v), 4), x[r])
                exact += probs[r, v] * g.pow(2) / n
        diffs.append((n * var - exact).double())
    d = torch.stack(diffs)
    for per_draw in (d, d.sum((1, 2))):  # every entry, and the trace
        standard_error = (per_draw.var(0) / len(diffs)).sqrt()
        assert (per_draw.mean(0).abs() < 6 * standard_error).all(), (per_draw.mean(0), standard_error)


def test_gradient_noise_loss_is_the_half_batch_estimate():
    """sum_i c_i (g_half - g)_i^2 with c = lr / (4 (sqrt(v_hat) + eps)), g the full batch's gradient (halves
    of equal size)."""
    model, opt, layers, batch = trained_tiny()
    stats = measure(PlannedModel(model, layers, opt, loss_fn), batch, ("fp8",), StatsConfig(max_rows=64),
                    DivergenceConfig(draws=1), gradient_noise=True)
    params = [p for p in model.parameters() if p.requires_grad]
    full = torch.autograd.grad(model.loss(batch), params)
    half = torch.autograd.grad(model.loss(batch[:2]), params)
    pre = adam_preconditioner(opt, dict(zip(params, full)))
    want = sum(float((pre.excess_loss_weight[p] * (h - g).pow(2)).sum()) for p, g, h in zip(params, full, half))
    assert stats.diagnostics["gradient_noise_loss"] == pytest.approx(want, rel=1e-5)
