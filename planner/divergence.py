"""Loss divergence and weight divergence (docs/design.md §4.3-4.4), batched over all layers.

Notation: y_l, x_l, dx_l = dy_l w_l are layer l's output, input and dgrad output on the calibration
batch; rms(.) is a tensor's root mean square; z is standard Gaussian noise of the tensor's shape.

Loss divergence.  The definition: with n = sigma rms(y_l) z injected into y_l alone,
    h_l = E[L(y+n) + L(y-n) - 2 L(y)] / (2 sigma^2)  =  rms(y_l)^2 tr(H_ll) / 2 + O(sigma^2),
H_ll the block of the loss Hessian w.r.t. y_l, and LD(l, p) = h_l e_fwd(l, p).
  * `method="per_layer"` computes exactly that: 2 forwards per layer per draw.
  * `method="batched"` injects independent noise n_l into *every* layer at once, once with +n and
    once with -n, and backpropagates both losses to the noisy outputs:
        n_l . (g_l(+n) - g_l(-n)) = 2 n_l . (H n)_l + O(sigma^4)
    and E[n_l . (H n)_l] = E[n_l^T H_ll n_l] because the cross terms n_l^T H_lm n_m (m != l) have
    mean zero for independent noise. So h_l = E[n_l . (g_l(+n) - g_l(-n))] / (4 sigma^2): the same
    quantity, for all layers from 2 forward/backward passes per draw. The cross terms are the
    estimator's noise: with few draws many layers read negative (and are floored at 0 by LD).
  * `method="fisher"` replaces H by its Gauss-Newton part G, the curvature of the loss through the
    model's output distribution (H = G + terms weighted by the residuals, small once the model fits;
    for softmax cross-entropy G is also the Fisher). With labels y^ drawn from the model's own
    predictions, the gradient g_l of the mean cross-entropy over N positions satisfies
    E ||g_l||^2 = tr(G_ll) / N (positions' draws are independent with mean-zero score), so
        h_l = rms(y_l)^2 N E||g_l||^2 / 2   >= 0 for every draw:
    one forward to the logits and one backward per draw, no noise, no cancellation.
  * `method="auto"` (default): "fisher" when the logits are available (a `logits_fn`), else "batched".
    The batched loss differences give the sum over layers, (L+ + L- - 2L) / (2 sigma^2) ~ sum_l h_l,
    and the Fisher estimate its Gauss-Newton counterpart: both kept as diagnostics.

Weight divergence.  Quantizing layer l's dgrad or wgrad adds noise to gradients. WD is the training loss
the optimizer pays for that noise: for Adam (diagonal preconditioner D = 1/(sqrt(v_hat) + eps), learning
rate lr) on a locally quadratic loss, gradient noise of variance s_i on parameter i raises the loss, once
the iterates have settled around the minimum, by
    E dL = lr/4 sum_i D_i s_i  =  sum_i c_i s_i,   c = stats.Preconditioner.excess_loss_weight
(the stationary covariance C of theta solves A C + C A = lr S in the preconditioned coordinates,
so tr(A C)/2 = lr tr(S)/4 for any curvature A: the stiff directions, which settle within 1/(lr h)
steps, reach it; the flat ones stay below it). In loss units WD / L is comparable with LD / L, and
lambda = 1 weighs them as the loss model says. Per unit relative noise energy, with the noise spread
evenly over the noisy tensor's entries:
  * wgrad: s_wgrad(l) = rms(dW_l)^2 sum_{i in W_l} c_i                     (closed form, no pass)
  * dgrad: noise nu = rms(dx_l) z on dx_l reaches every upstream parameter as a cotangent on x_l,
    delta_g = J_l^T nu with J_l = d x_l / d theta, so s_dgrad(l) = rms(dx_l)^2 tr(J_l C J_l^T).
    `per_layer` draws z and backpropagates it from x_l (one backward per layer per draw).
    `batched` / `fisher` use tr(J C J^T) = E_w ||J_l C^(1/2) w||^2 over w ~ N(0, I) in parameter space:
    one forward with theta + h C^(1/2) w gives J_l C^(1/2) w = (x_l(+) - x_l) / h for
    every layer at once, x_l read on the rows the statistics pass sampled (its values at theta). The
    relative step h is 1e-3 of ||theta||: the one-sided difference's O(h) bias is far below the
    Monte Carlo noise. Parameter entries whose gradient is exactly zero on this batch (e.g. embedding
    rows of absent tokens) get no perturbation: they reach no x_l, and their huge 1/(sqrt(v)+eps) would
    otherwise force a tiny step h.
Per unit relative noise energy, WD(l, p) = s_dgrad e_dgrad(l, p) + s_wgrad e_wgrad(l, p).

The settled excess loss is reached only in the stiff directions. With `wd_horizon` T (steps; the
planner's re-plan interval is the natural choice, as a plan only lives that long), WD is the excess
loss T steps after the noise starts instead: along parameter i, with curvature G_ii,
the preconditioned iteration theta <- theta - lr D_i (G_ii theta + noise) grows the variance as
1 - (1 - lr D_i G_ii)^(2T) ~ 1 - exp(-2 T lr D_i G_ii) of its stationary value, so
    c_i  ->  c_i (1 - exp(-2 T lr D_i G_ii))  =  c_i (1 - exp(-8 T c_i G_ii))          (lr D_i = 4 c_i)
(flat directions pay ~ T lr^2 D_i^2 G_ii s_i / 2, the stiff ones the settled c_i s_i). G_ii is the
Gauss-Newton diagonal, from the Fisher draws' sampled-label gradients with respect to the parameters,
E g_i^2 = G_ii / N (the identity of "fisher" above, per parameter), taken in the same backward
passes as the loss curvature: no extra pass. Without the Fisher draws (no logits, or method "batched" /
"per_layer") G_ii is read from the variance of the batch-mean gradient instead, G_ii ~ N Var(g_i) with
N the linear layers' rows (stats.gradient_variance: one forward/backward of half the batch). That is the
centred empirical Fisher: the Gauss-Newton diagonal in expectation when the labels follow the model and
the positions are independent; positively correlated positions (tokens of one sequence) read it larger,
so the horizon saturates sooner and WD leans towards its settled value. Given the learning rates of the
horizon's steps (`measure`'s lr_ratios: a schedule's decay), the factor 1 - exp(-2 T lr D_i G_ii) becomes
its counterpart under that schedule (planner.horizon).

Adam's signal share.  WD prices gradient noise at a fixed preconditioner D = 1/(sqrt(v_hat) + eps). But
Adam divides by the sqrt(v) of the noisy gradient, and in a direction where v is mostly noise (v = mu^2 +
Var(g), mu the expected gradient, mu^2 << v) the random walk's step variance is lr^2 Var(g) / v =
lr^2 (v - mu^2) / v: extra noise s raises v as much as Var(g), so it changes the walk by WD's price times
mu^2 / v only (in the settled, stiff directions the excess loss grows as sqrt(v) and the factor is 1/2).
So every layer's s_wgrad is multiplied by the signal share of Adam's second moment, measured on the
calibration batch: per layer,
    f_l = ||mu_l||^2 / sum(v_hat_l),   ||mu_l||^2 = B (||dW_l||^2 - sum_s ||dW_l,s||^2) / (B - 1)
with dW_l the batch loss's weight gradient and dW_l,s = dy_s^T x_s its share from sequence s of the B in
the batch (independent sequences: sum_{a != b} dW_a . dW_b estimates ||mu||^2 without bias; the statistics
pass measures sum_s ||dW_s||^2, stats.sequence_grad_sq), v_hat that of the next update (stats.Preconditioner).
One layer's f_l is too noisy to rank by (its split-batch rank correlation is about 0 on the tiny preset), so
one factor serves all layers: the f_l weighted by s_wgrad(l) times the layer's largest wgrad error among the
candidates, clipped to [0, 1] (diagnostics["wgrad_signal_share"]). dgrad keeps its price: its error carries the
weight operand's quantization error, the same at every step, a bias that Adam does not average away. The
estimate needs the batch's sequences as the leading dimension of every planned layer's input and sequences
that do not interact (no batch normalisation); without that layout WD keeps its price and a warning says so.

Cost (D = draws): "fisher" D backwards for LD (and the Gauss-Newton diagonal) through the statistics pass's forward
where the loss calls the model on lm_logits' inputs (the default loss of a causal LM), 1 forward more otherwise;
"batched" 2D forward+backward passes; D forwards for WD; plus the statistics pass and the quantization errors. The
signal share costs one more weight-gradient GEMM per layer in the statistics pass (or the two T x T Gram
products per sequence, when cheaper). Extra memory: the graph of one forward (fisher) or the noise of every
layer output (batched) during LD, two parameter-sized copies (theta and the direction) during WD, and one (the
diagonal) with wd_horizon; the statistics pass holds every layer's input to its backward for the signal share.
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Literal, Mapping, NamedTuple, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from .horizon import HorizonTable
from .qerror import gemm_errors
from .stats import (LayerStats, LossFn, PlannerStats, Recording, StatsConfig, gradient_noise_loss, gradient_variance,
                    high_precision, isolated_rng, record)

__all__ = ["DivergenceConfig", "LogitsFn", "PlannedModel", "lm_logits", "loss_curvature", "weight_sensitivity",
           "signal_fractions", "weighted_signal_share", "measure"]

# (model, batch) -> logits [..., vocabulary] whose softmax is the model's prediction at every position the
# loss averages over (see the module docstring, method "fisher").
LogitsFn = Callable[[nn.Module, object], torch.Tensor]
METHODS = ("auto", "fisher", "batched", "per_layer")


def _lm_inputs(batch: torch.Tensor) -> torch.Tensor:
    """What a causal LM sees of a window batch [B, T+1]: its first T tokens (the convention of `model.loss(window)`,
    the planner's default loss)."""
    return batch[:, :-1]


def lm_logits(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """The logits of a causal LM on a window batch [B, T+1]: `model(_lm_inputs(batch))`, or its `.logits` (Hugging
    Face outputs)."""
    out = model(_lm_inputs(batch))
    logits = getattr(out, "logits", out)
    if not torch.is_tensor(logits) or logits.shape[:2] != batch[:, 1:].shape:
        raise TypeError(f"{type(model).__name__}(tokens) does not return logits [B, T, vocabulary] for a window "
                        "batch [B, T+1]; pass logits_fn=(model, batch) -> logits to the planner")
    return logits


@dataclass(frozen=True)
class PlannedModel:
    """What the planner measures: the model, its planned linear layers ({FQN: module}), the optimizer whose next
    update WD prices (None: StatsConfig.default_lr and each gradient's second moment), the loss (model, batch) ->
    scalar, and the logits (model, batch) -> logits that the Fisher curvature needs (None: no Fisher draws)."""

    model: nn.Module
    layers: Mapping[str, nn.Linear]
    optimizer: torch.optim.Optimizer | None
    loss_fn: LossFn
    logits_fn: LogitsFn | None = None


@dataclass(frozen=True)
class DivergenceConfig:
    sigma: float = 0.05        # relative size of the output noise for loss curvature ("batched", "per_layer")
    draws: int = 2             # antithetic pairs ("batched", "per_layer") or label draws ("fisher") per estimate
    param_step: float = 1e-3   # ||h C^(1/2) w|| / ||theta||, the parameter perturbation of the batched WD
    method: Literal["auto", "fisher", "batched", "per_layer"] = "auto"
    wd_horizon: int | None = None  # WD as the excess loss after this many steps (None: settled), see above;
                                   # the planner sets it to its re-plan interval (PlannerConfig.wd_horizon)
    seed: int = 0

    def __post_init__(self):
        if not 0 < self.sigma < 1:
            raise ValueError(f"sigma must be in (0, 1), got {self.sigma}")
        if self.draws < 1:
            raise ValueError(f"draws must be >= 1, got {self.draws}")
        if not 0 < self.param_step < 0.1:
            raise ValueError(f"param_step must be in (0, 0.1), got {self.param_step}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        if self.wd_horizon is not None and self.wd_horizon < 1:
            raise ValueError(f"wd_horizon must be >= 1 step or None, got {self.wd_horizon}")


def _generator(seed: int, key: tuple[int, ...], device: torch.device) -> torch.Generator:
    h = seed
    for k in key:
        h = (h * 1_000_003 + k + 1) % (2**61 - 1)
    return torch.Generator(device=device).manual_seed(h)


def _noise(like: torch.Tensor, seed: int, *key: int) -> torch.Tensor:
    """Standard normal noise of `like`'s shape, a pure function of (seed, key)."""
    return torch.randn(like.shape, generator=_generator(seed, key, like.device), device=like.device,
                       dtype=torch.float32)


def _run(model, batch, loss_fn, seed: int, hooks: Iterable[tuple[nn.Module, str, object]]):
    """loss_fn(model, batch) with temporary hooks ("forward" or "pre") and a fixed RNG state."""
    handles = []
    try:
        for module, kind, fn in hooks:
            handles.append(module.register_forward_hook(fn) if kind == "forward"
                           else module.register_forward_pre_hook(fn))
        with isolated_rng(seed, next(model.parameters()).device):
            return loss_fn(model, batch)
    finally:
        for h in handles:
            h.remove()


def _sample(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One label per row of `probs` [rows, classes], drawn by inverting the row's CDF at a uniform u: the
    class i with cdf[i-1] <= u cdf[-1] < cdf[i] (classes of zero mass are never drawn). One uniform per row:
    on the tiny model's 1024 x 256 probabilities about 0.2 ms a draw on the CPU, against 4 ms for
    torch.multinomial (a tenth of a training step for the two draws)."""
    cdf = probs.double().cumsum(-1)
    u = torch.rand(probs.shape[0], 1, generator=gen, device=probs.device, dtype=torch.float64)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)


def fisher_labels(probs: torch.Tensor, seed: int, draw: int) -> torch.Tensor:
    """The labels of Fisher draw `draw` under `seed`: what LD's curvature backpropagates, so that a study's
    Gauss-Newton forms can use the very draws the planner used."""
    return _sample(probs, _generator(seed, (draw,), probs.device))


class FisherDraws(NamedTuple):
    curvature: dict[str, float]                      # {layer: h_l}
    diagnostics: dict[str, float]
    gauss_newton: dict[nn.Parameter, torch.Tensor]   # {parameter: its Gauss-Newton diagonal} for the asked ones


def _fisher_curvature(planned: PlannedModel, batch, rec: Recording, config: DivergenceConfig, seed: int,
                      params: Sequence[nn.Parameter] = ()) -> FisherDraws:
    """The label draws of method "fisher": the curvature and the Gauss-Newton diagonal of `params`. The draws
    backpropagate through the statistics pass's forward where it kept one (rec.logits_graph, the same forward:
    same batch, precision and RNG seed), else through a forward of their own."""
    if planned.logits_fn is None:
        raise ValueError("method 'fisher' needs the model's logits: pass logits_fn=(model, batch) -> logits")
    layers = planned.layers
    names = list(layers)
    if rec.logits_graph is not None:
        logits, outputs = rec.logits_graph.logits, rec.logits_graph.outputs
    else:
        outputs = {}

        def keep(name):
            def hook(mod, args, out):
                outputs[name] = out
            return hook

        logits = _run(planned.model, batch, planned.logits_fn, seed, [(layers[n], "forward", keep(n)) for n in names])
    logits = logits.reshape(-1, logits.shape[-1]).float()
    probs = logits.detach().softmax(-1)
    positions = logits.shape[0]
    h = {n: 0.0 for n in names}
    gn = {p: torch.zeros_like(p, dtype=torch.float32) for p in params}
    for d in range(config.draws):
        labels = fisher_labels(probs, config.seed, d)
        loss = F.cross_entropy(logits, labels)
        grads = torch.autograd.grad(loss, [outputs[n] for n in names] + list(params),
                                    retain_graph=d + 1 < config.draws, allow_unused=True)
        for n, g in zip(names, grads):
            sq = float(g.float().pow(2).sum()) if g is not None else 0.0
            h[n] += rec.layers[n].out_rms ** 2 * positions * sq / 2 / config.draws
        for p, g in zip(params, grads[len(names):]):
            if g is not None:
                gn[p] += positions * g.float().pow(2) / config.draws
    return FisherDraws(h, {"curvature_sum": sum(h.values()), "ld_fisher": 1.0}, gn)


def _curvature_method(config: DivergenceConfig, logits_fn: LogitsFn | None) -> str:
    if config.method == "auto":
        return "fisher" if logits_fn is not None else "batched"
    return config.method


def _per_layer_curvature(planned: PlannedModel, batch, rec: Recording, config: DivergenceConfig, seed: int
                         ) -> dict[str, float]:
    """{layer: h_l} of method "per_layer": antithetic noise on one layer's output at a time."""
    rms = {n: rec.layers[n].out_rms for n in planned.layers}
    sigma = config.sigma
    h = {n: 0.0 for n in planned.layers}
    with torch.no_grad():
        for i, name in enumerate(planned.layers):
            for d in range(config.draws):
                pair = []
                for sign in (1.0, -1.0):
                    def add(mod, args, out, sign=sign, d=d, i=i):
                        return out + (sign * sigma * rms[name] * _noise(out, config.seed, d, i)).to(out.dtype)
                    pair.append(float(_run(planned.model, batch, planned.loss_fn, seed,
                                           [(planned.layers[name], "forward", add)])))
                h[name] += (pair[0] + pair[1] - 2 * rec.loss) / (2 * sigma**2) / config.draws
    return h


def _batched_curvature(planned: PlannedModel, batch, rec: Recording, config: DivergenceConfig, seed: int
                       ) -> tuple[dict[str, float], float]:
    """({layer: h_l}, the loss differences' estimate of their sum) of method "batched": antithetic noise on every
    layer's output at once."""
    names = list(planned.layers)
    rms = {n: rec.layers[n].out_rms for n in names}
    sigma = config.sigma
    h = {n: 0.0 for n in names}
    fd_total = 0.0
    for d in range(config.draws):
        dots, losses, zs = {}, [], {}  # zs: the draw's noise, made in the + pass, reused in the - pass
        for sign in (1.0, -1.0):
            noisy = {}

            def add(name, i, sign=sign, d=d):
                def hook(mod, args, out):
                    if name not in zs:
                        zs[name] = _noise(out, config.seed, d, i)
                    noisy[name] = torch.add(out, zs[name].to(out.dtype), alpha=sign * sigma * rms[name])
                    return noisy[name]
                return hook

            loss = _run(planned.model, batch, planned.loss_fn, seed,
                        [(planned.layers[n], "forward", add(n, i)) for i, n in enumerate(names)])
            grads = torch.autograd.grad(loss, [noisy[n] for n in names], allow_unused=True)
            for n, g in zip(names, grads):
                dots[n, sign] = float(torch.dot(zs[n].flatten(), g.float().flatten())) if g is not None else 0.0
            losses.append(float(loss.detach()))
        for n in names:
            h[n] += rms[n] * (dots[n, 1.0] - dots[n, -1.0]) / (4 * sigma) / config.draws
        fd_total += (losses[0] + losses[1] - 2 * rec.loss) / (2 * sigma**2) / config.draws
    return h, fd_total


def loss_curvature(planned: PlannedModel, batch, rec: Recording, config: DivergenceConfig, seed: int
                   ) -> tuple[dict[str, float], dict[str, float]]:
    """({layer: h_l}, diagnostics), see the module docstring."""
    method = _curvature_method(config, planned.logits_fn)
    if method == "fisher":
        return _fisher_curvature(planned, batch, rec, config, seed)[:2]
    if method == "per_layer":
        return _per_layer_curvature(planned, batch, rec, config, seed), {"ld_fisher": 0.0}
    h, fd_total = _batched_curvature(planned, batch, rec, config, seed)
    return h, {"ld_fisher": 0.0, "curvature_sum_from_loss_differences": fd_total, "curvature_sum": sum(h.values())}


def _dgrad_traces_per_layer(planned: PlannedModel, batch, weights: Mapping[nn.Parameter, torch.Tensor],
                            config: DivergenceConfig, seed: int) -> dict[str, float]:
    """{layer: tr(J_l C J_l^T)} of method "per_layer": noise backpropagated from each layer's input."""
    layers = planned.layers
    params = list(weights)
    acc = {n: 0.0 for n in layers}
    inputs = {}

    def keep(name):
        def hook(mod, args):
            inputs[name] = args[0]
        return hook

    _run(planned.model, batch, planned.loss_fn, seed, [(layers[n], "pre", keep(n)) for n in layers])  # the graph to x_l
    for i, n in enumerate(layers):
        for d in range(config.draws):
            dg = torch.autograd.grad(inputs[n], params, grad_outputs=_noise(inputs[n], config.seed, d, i).to(
                inputs[n].dtype), retain_graph=True, allow_unused=True)
            acc[n] += sum(float((weights[p] * g.float().pow(2)).sum()) for p, g in zip(params, dg)
                          if g is not None) / config.draws
    return acc


def _dgrad_traces_batched(planned: PlannedModel, batch, rec: Recording, weights: Mapping[nn.Parameter, torch.Tensor],
                          config: DivergenceConfig, seed: int) -> dict[str, float]:
    """{layer: tr(J_l C J_l^T)} of methods "batched" / "fisher": one perturbed forward per draw for all layers."""
    layers = planned.layers
    params = list(weights)
    acc = {n: 0.0 for n in layers}
    theta0 = [p.detach().clone() for p in params]
    theta_norm = float(torch.sqrt(sum(t.float().pow(2).sum() for t in theta0)))
    try:
        for d in range(config.draws):
            dirs = [weights[p].sqrt() * _noise(p, config.seed, d, j) * (rec.grads[p] != 0)
                    for j, p in enumerate(params)]
            dir_norm = float(torch.sqrt(sum(v.pow(2).sum() for v in dirs)))
            if dir_norm == 0:
                continue
            step = config.param_step * theta_norm / dir_norm

            def grab(name):
                r = rec.layers[name]
                scale = r.shape.tokens / r.rows.numel()  # the sampled rows stand for all M rows

                def hook(mod, args):
                    x = args[0].detach().reshape(-1, mod.in_features)[r.rows].float()
                    acc[name] += scale * float((x - r.x).pow(2).sum()) / step**2 / config.draws
                return hook

            with torch.no_grad():
                for p, t0, v in zip(params, theta0, dirs):
                    p.copy_(t0 + (step * v).to(t0.dtype))
                _run(planned.model, batch, planned.loss_fn, seed, [(layers[n], "pre", grab(n)) for n in layers])
    finally:
        with torch.no_grad():
            for p, t0 in zip(params, theta0):
                p.copy_(t0)
    return acc


def weight_sensitivity(planned: PlannedModel, batch, rec: Recording, grad_in_rms: Mapping[str, float],
                       config: DivergenceConfig, seed: int) -> tuple[dict[str, float], dict[str, float]]:
    """({layer: s_dgrad}, {layer: s_wgrad}), see the module docstring."""
    weights = rec.preconditioner.excess_loss_weight
    s_wgrad = {}
    for n, layer in planned.layers.items():
        w = layer.weight
        if w in weights:
            s_wgrad[n] = float(rec.layers[n].weight_grad.pow(2).mean() * weights[w].sum())
        else:  # not trained by the optimizer: its update cannot change
            s_wgrad[n] = 0.0
    if config.method == "per_layer":
        acc = _dgrad_traces_per_layer(planned, batch, weights, config, seed)
    else:
        acc = _dgrad_traces_batched(planned, batch, rec, weights, config, seed)
    s_dgrad = {n: grad_in_rms[n] ** 2 * acc[n] for n in planned.layers}
    return s_dgrad, s_wgrad


def signal_fractions(rec: Recording, layers: Mapping[str, nn.Linear]) -> dict[str, float]:
    """{layer: f_l = ||mu_l||^2 / sum(v_hat_l)} for every layer whose weight the optimizer trains, from a recording
    with sequence_grads (see the module docstring, "Adam's signal share"). Reads below 0 where the signal is below
    the estimate's noise."""
    if rec.sequences is None:
        raise ValueError("the signal fractions need the per-sequence gradients: record(..., sequence_grads=True) on "
                         "a batch of >= 2 sequences laid out as the leading dimension of every layer's input")
    out = {}
    for name, r in rec.layers.items():
        v = rec.preconditioner.second_moment_sum.get(layers[name].weight)
        if v:
            pairs = float(r.weight_grad.double().pow(2).sum()) - r.sequence_grad_sq  # sum_{a != b} dW_a . dW_b
            out[name] = pairs * rec.sequences / (rec.sequences - 1) / v
    return out


def weighted_signal_share(fractions: Mapping[str, float], s_wgrad: Mapping[str, float],
                          errors: Mapping[str, Mapping[str, Mapping[str, float]]]) -> float:
    """One signal share for the layers of `fractions`: their f_l weighted by s_wgrad(l) times the layer's largest
    wgrad error over the candidates (`errors`: layer -> precision -> GEMM -> error), clipped to [0, 1]; 1 where
    no layer's wgrad has a price."""
    weights = {n: s_wgrad[n] * max(e["wgrad"] for e in errors[n].values()) for n in fractions}
    total = sum(weights.values())
    if not total > 0:
        return 1.0
    return min(1.0, max(0.0, sum(weights[n] * f for n, f in fractions.items()) / total))


def _horizon_weights(weights: Mapping[nn.Parameter, torch.Tensor], gauss_newton: Mapping[nn.Parameter, torch.Tensor],
                    horizon: int, lr_ratios: Sequence[float] | None) -> dict[nn.Parameter, torch.Tensor]:
    """The settled excess-loss weights c (Preconditioner.excess_loss_weight) scaled to the excess loss reached
    within `horizon` steps, given each parameter's Gauss-Newton diagonal (absent: no gradient on this batch,
    G_ii = 0): at a constant learning rate, or along `lr_ratios` (planner.horizon); see the module docstring."""
    table = HorizonTable(lr_ratios) if lr_ratios is not None else None
    out = {}
    for p, c in weights.items():
        g = gauss_newton.get(p, 0.0)
        out[p] = c * (-torch.expm1(-8 * horizon * c * g) if table is None else table(4 * c * g))  # a = lr D G = 4 c G
    return out


def _check_schedule(config: DivergenceConfig, lr_ratios: Sequence[float] | None) -> None:
    if lr_ratios is None:
        return
    if config.wd_horizon is None:
        raise ValueError("lr_ratios schedule WD's horizon: set DivergenceConfig.wd_horizon")
    if len(lr_ratios) != config.wd_horizon:
        raise ValueError(f"lr_ratios has {len(lr_ratios)} steps, the horizon {config.wd_horizon}")


def _record(planned: PlannedModel, batch, stats_config: StatsConfig, fisher: bool) -> Recording:
    """The statistics pass, with the per-sequence gradients of the signal share. lm_logits is the model's call on
    _lm_inputs: the Fisher draws reuse the pass's forward when the loss makes that call (the default loss of a
    causal LM does)."""
    lm_window = fisher and planned.logits_fn is lm_logits and torch.is_tensor(batch) and batch.dim() == 2
    return record(planned.model, planned.layers, batch, planned.loss_fn, planned.optimizer, stats_config,
                  sequence_grads=True, logits_of=_lm_inputs(batch) if lm_window else None)


def _signal_share(rec: Recording, layers: Mapping[str, nn.Linear], s_wgrad: Mapping[str, float],
                  errors: Mapping[str, Mapping[str, Mapping[str, float]]]) -> float | None:
    """The factor on wgrad's WD ("Adam's signal share"); None, with a warning, where the batch's layout does not
    allow measuring it."""
    if rec.sequences is None:
        warnings.warn("wgrad's WD keeps its price without Adam's signal share: the batch's sequences are not the "
                      "leading dimension of every planned layer's input (or there is only one)", stacklevel=3)
        return None
    return weighted_signal_share(signal_fractions(rec, layers), s_wgrad, errors)


def _layer_stats(rec: Recording, curvature: Mapping[str, float], grad_in_rms: Mapping[str, float],
                 s_dgrad: Mapping[str, float], s_wgrad: Mapping[str, float],
                 errors: Mapping[str, Mapping[str, Mapping[str, float]]]) -> tuple[LayerStats, ...]:
    return tuple(LayerStats(
        shape=r.shape, out_rms=r.out_rms, grad_out_rms=r.grad_out_rms, grad_in_rms=grad_in_rms[n],
        weight_grad_rms=float(r.weight_grad.pow(2).mean().sqrt()), curvature=curvature[n],
        s_dgrad=s_dgrad[n], s_wgrad=s_wgrad[n], errors=errors[n]) for n, r in rec.layers.items())


def measure(planned: PlannedModel, batch, candidates: Iterable[str], stats_config: StatsConfig = StatsConfig(),
            config: DivergenceConfig = DivergenceConfig(), step: int | None = None, *, gradient_noise: bool = False,
            lr_ratios: Sequence[float] | None = None) -> PlannerStats:
    """Statistics -> quantization errors -> LD and WD sensitivities for every layer of `planned`.
    `planned.logits_fn` enables the Fisher loss curvature (DivergenceConfig.method "auto" / "fisher");
    `gradient_noise` adds diagnostics["gradient_noise_loss"] (stats.gradient_noise_loss, a tensor batch);
    `lr_ratios`, the learning rate at each of the horizon's `wd_horizon` steps relative to the current one,
    prices WD's horizon under that schedule (planner.horizon) instead of at a constant learning rate."""
    candidates = tuple(candidates)
    _check_schedule(config, lr_ratios)
    seed, layers = stats_config.seed, planned.layers
    fisher = _curvature_method(config, planned.logits_fn) == "fisher"
    times = {}
    t = time.perf_counter()
    rec = _record(planned, batch, stats_config, fisher)
    times["time_record_s"] = time.perf_counter() - t
    weights = rec.preconditioner.excess_loss_weight
    # the horizon's Gauss-Newton diagonal from the Fisher draws when LD makes them, else from the gradient variance
    fisher_diagonal = config.wd_horizon is not None and fisher
    with high_precision(layers):
        t = time.perf_counter()
        if fisher:
            curvature, diag, gn = _fisher_curvature(planned, batch, rec, config, seed,
                                                    list(weights) if fisher_diagonal else ())
            rec.logits_graph = None  # frees the statistics pass's graph
        else:
            curvature, diag = loss_curvature(planned, batch, rec, config, seed)
        times["time_loss_divergence_s"] = time.perf_counter() - t
    t = time.perf_counter()
    errors = {n: gemm_errors(r, candidates, seed) for n, r in rec.layers.items()}
    grad_in_rms = {n: float((r.dy @ r.weight.float()).pow(2).mean().sqrt()) for n, r in rec.layers.items()}
    times["time_errors_s"] = time.perf_counter() - t
    variance = None
    if gradient_noise or (config.wd_horizon is not None and not fisher_diagonal):
        t = time.perf_counter()
        variance = gradient_variance(planned.model, layers, batch, planned.loss_fn, rec, seed)
        times["time_gradient_variance_s"] = time.perf_counter() - t
    if config.wd_horizon is not None:
        if not fisher_diagonal:  # the linear layers' rows are the positions the loss averages over
            positions = next(iter(rec.layers.values())).shape.tokens
            gn = {p: positions * v for p, v in variance.items()}
        rec.preconditioner.excess_loss_weight = _horizon_weights(weights, gn, config.wd_horizon, lr_ratios)
    # the minibatch's own gradient noise, priced by the same excess-loss weights as WD
    noise = gradient_noise_loss(variance, rec) if gradient_noise else None
    with high_precision(layers):
        t = time.perf_counter()
        s_dgrad, s_wgrad = weight_sensitivity(planned, batch, rec, grad_in_rms, config, seed)
        times["time_weight_divergence_s"] = time.perf_counter() - t
    share = _signal_share(rec, layers, s_wgrad, errors)
    if share is not None:
        s_wgrad = {n: v * share for n, v in s_wgrad.items()}
        diag["wgrad_signal_share"] = share
    diag.update(times)
    diag["sampled_rows"] = float(next(iter(rec.layers.values())).x.shape[0])
    if noise is not None:
        diag["gradient_noise_loss"] = noise
    if not all(math.isfinite(v) for v in curvature.values()):
        raise FloatingPointError("a loss curvature estimate is not finite")
    return PlannerStats(_layer_stats(rec, curvature, grad_in_rms, s_dgrad, s_wgrad, errors), rec.loss, step,
                        rec.preconditioner.source, diag)
