"""Loss divergence and weight divergence (DESIGN.md §4.3-4.4), batched over all layers.

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
  * Directional LD (`ld_form="directional"`, with "fisher"; opt-in). h_l e_fwd prices the forward error
    as noise spread evenly over y_l's entries. The real error e = Q(x) Q(w)^T - x w^T is not: the input's
    rounding reaches y_l through w, so it lies where w maps it, and that is where the curvature of y_l lies
    too. The same Gauss-Newton form taken along the actual error is 1/2 e^T G e = N/2 E (g . e)^2 over the
    draws' cotangents g (the identity above); this estimate keeps each position's own term,
        LD(l, p) = N/2 (M / m) E sum_{t in rows} (g_t . e_t(p))^2,
    on the m rows of the M that the statistics pass sampled, where the quantization errors are measured
    (e_t(p) is that row's error under precision p; row-wise GEMM, so a row's error is its error in the batch).
    It is stored as the ratio to h_l e_fwd (LayerStats.fprop_alignment), so that LD = h_l e_fwd times it.
    It drops the cross terms between positions of one sequence (positions of different sequences are
    independent: mean zero). On the tiny preset's checkpoints (100, 400, 1200 steps) and mini's (400 steps),
    FP4, against the whole form with those cross terms (all 1024 rows, 16 draws): the isotropic LD reads
    0.30-0.56x it per layer (median) and 0.33, 0.38, 0.57 and 0.32x its sum; this estimate 0.9-1.0x per
    layer (median; 10-90%: 0.5-1.8x, the row sample's noise) and 0.76-1.04x the sum on tiny, 1.5x on mini.
    The error that the weight's rounding makes is close to isotropic (its directional form 0.9-1.2x its
    isotropic one); the input's rounding costs 3-5x its isotropic price. The whole form itself is within 3%
    of the loss change measured with every forward GEMM in FP4 at once where that change is above its noise
    (mini at 400 steps, tiny at 400 and 1200; bench/bench_forward_error.py).
  * `method="auto"` (default): "fisher" when the logits are available (a `logits_fn`), else "batched".
    The batched loss differences give the sum over layers, (L+ + L- - 2L) / (2 sigma^2) ~ sum_l h_l,
    and the Fisher estimate its Gauss-Newton counterpart: both kept as diagnostics.

Weight divergence.  Quantizing layer l's dgrad or wgrad adds noise to gradients. With `wd_units`
"loss" (default) WD is the training loss the optimizer pays for that noise: for Adam (diagonal
preconditioner D = 1/(sqrt(v_hat) + eps), learning rate lr) on a locally quadratic loss, gradient noise
of variance s_i on parameter i raises the loss, once the iterates have settled around the minimum, by
    E dL = lr/4 sum_i D_i s_i  =  sum_i c_i s_i,   c = stats.Preconditioner.excess_loss_weight
(the stationary covariance C of theta solves A C + C A = lr S in the preconditioned coordinates,
so tr(A C)/2 = lr tr(S)/4 for any curvature A: the stiff directions, which settle within 1/(lr h)
steps, reach it; the flat ones stay below it). In loss units WD / L is comparable with LD / L, and
lambda = 1 weighs them as the loss model says. Per unit relative noise energy, with the noise spread
evenly over the noisy tensor's entries:
  * wgrad: s_wgrad(l) = rms(dW_l)^2 sum_{i in W_l} c_i                     (closed form, no pass)
  * dgrad: noise nu = rms(dx_l) z on dx_l reaches every upstream parameter as a cotangent on x_l,
    delta_g = J_l^T nu with J_l = d x_l / d theta, so s_dgrad(l) = rms(dx_l)^2 tr(J_l C J_l^T).
With `wd_units` "update" (the earlier definition) c_i is replaced by P_i^2 / U^2, P = d(update)/d(grad)
(stats.adam_preconditioner) and U^2 the squared norm of the clean update: the relative squared change
of the next update, a quantity without a loss scale.
    `per_layer` draws z and backpropagates it from x_l (one backward per layer per draw).
    `batched` / `fisher` use tr(J M J^T) = E_w ||J_l M^(1/2) w||^2 over w ~ N(0, I) in parameter space
    (M = C or P^2): one forward with theta + h M^(1/2) w gives J_l M^(1/2) w = (x_l(+) - x_l) / h for
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
its counterpart under that schedule (planner.horizon). With the schedule's steps after the horizon too
(`lr_after`), WD is the excess loss the plan's noise leaves at the run's end (planner.horizon): the stiff
directions forget it after the plan's life, the flat ones keep it.

Adam's signal share.  WD prices gradient noise at a fixed preconditioner D = 1/(sqrt(v_hat) + eps). But
Adam divides by the sqrt(v) of the noisy gradient, and in a direction where v is mostly noise (v = mu^2 +
Var(g), mu the expected gradient, mu^2 << v) the random walk's step variance is lr^2 Var(g) / v =
lr^2 (v - mu^2) / v: extra noise s raises v as much as Var(g), so it changes the walk by WD's price times
mu^2 / v only (in the settled, stiff directions the excess loss grows as sqrt(v) and the factor is 1/2).
With `wgrad_signal_share` (default), every layer's s_wgrad is multiplied by the signal share of Adam's
second moment, measured on the calibration batch: per layer,
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
where the loss calls the model on lm_logits' inputs (the default loss of a causal LM), 1 forward more otherwise; the
directional LD adds dot products on the sampled rows; "batched" 2D forward+backward passes; D forwards for WD; plus
the statistics pass and the quantization errors. The signal share costs one more weight-gradient GEMM per layer in the statistics pass (or the two T x T Gram
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
from .qerror import gemm_outputs, relative_errors
from .stats import (WD_UNITS, LayerStats, LossFn, PlannerStats, Recording, StatsConfig, gradient_noise_loss,
                    gradient_variance, high_precision, isolated_rng, record)

__all__ = ["DivergenceConfig", "LogitsFn", "lm_logits", "loss_curvature", "weight_sensitivity", "signal_fractions",
           "weighted_signal_share", "measure"]

# (model, batch) -> logits [..., vocabulary] whose softmax is the model's prediction at every position the
# loss averages over (see the module docstring, method "fisher").
LogitsFn = Callable[[nn.Module, object], torch.Tensor]
METHODS = ("auto", "fisher", "batched", "per_layer")
LD_FORMS = ("isotropic", "directional")


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
class DivergenceConfig:
    sigma: float = 0.05        # relative size of the output noise for loss curvature ("batched", "per_layer")
    draws: int = 2             # antithetic pairs ("batched", "per_layer") or label draws ("fisher") per estimate
    param_step: float = 1e-3   # ||h M^(1/2) w|| / ||theta||, the parameter perturbation of the batched WD
    method: Literal["auto", "fisher", "batched", "per_layer"] = "auto"
    ld_form: Literal["isotropic", "directional"] = "isotropic"  # or LD along the error's direction ("fisher")
    wd_units: Literal["loss", "update"] = "loss"
    wd_horizon: int | None = None  # WD as the excess loss after this many steps (None: settled), see above;
                                   # the planner sets it to its re-plan interval (PlannerConfig.wd_horizon)
    wgrad_signal_share: bool = True  # wgrad's WD times the signal share of Adam's second moment, see above
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
        if self.wd_units not in WD_UNITS:
            raise ValueError(f"wd_units must be one of {WD_UNITS}, got {self.wd_units!r}")
        if self.ld_form not in LD_FORMS:
            raise ValueError(f"ld_form must be one of {LD_FORMS}, got {self.ld_form!r}")
        if self.wd_horizon is not None:
            if self.wd_horizon < 1:
                raise ValueError(f"wd_horizon must be >= 1 step or None, got {self.wd_horizon}")
            if self.wd_units != "loss":
                raise ValueError(f"wd_horizon needs wd_units 'loss' (an excess loss), got {self.wd_units!r}")
        if self.wgrad_signal_share and self.wd_units != "loss":
            raise ValueError(f"wgrad_signal_share scales an excess loss: it needs wd_units 'loss', got "
                             f"{self.wd_units!r} (pass wgrad_signal_share=False)")


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


class FisherDraws(NamedTuple):
    curvature: dict[str, float]                      # {layer: h_l}
    diagnostics: dict[str, float]
    gauss_newton: dict[nn.Parameter, torch.Tensor]   # {parameter: its Gauss-Newton diagonal} for the asked ones
    cotangents: dict[str, list[torch.Tensor]]        # {layer: each draw's g on the sampled rows} (directional LD)
    positions: int                                   # N, the positions the loss averages over


def _fisher_curvature(model, layers: Mapping[str, nn.Linear], batch, logits_fn: LogitsFn, rec: Recording,
                      config: DivergenceConfig, seed: int, params: Sequence[nn.Parameter] = ()) -> FisherDraws:
    """The label draws of method "fisher": the curvature, the Gauss-Newton diagonal of `params`, and with ld_form
    "directional" the draws' cotangents on the rows the statistics pass sampled. The draws backpropagate through
    the statistics pass's forward where it kept one (rec.logits_graph, the same forward: same batch, precision and
    RNG seed), else through a forward of their own."""
    if logits_fn is None:
        raise ValueError("method 'fisher' needs the model's logits: pass logits_fn=(model, batch) -> logits")
    names = list(layers)
    if rec.logits_graph is not None:
        logits, outputs = rec.logits_graph.logits, rec.logits_graph.outputs
    else:
        outputs = {}

        def keep(name):
            def hook(mod, args, out):
                outputs[name] = out
            return hook

        logits = _run(model, batch, logits_fn, seed, [(layers[n], "forward", keep(n)) for n in names])
    logits = logits.reshape(-1, logits.shape[-1]).float()
    probs = logits.detach().softmax(-1)
    positions = logits.shape[0]
    h = {n: 0.0 for n in names}
    gn = {p: torch.zeros_like(p, dtype=torch.float32) for p in params}
    directional = config.ld_form == "directional"
    cotangents = {n: [] for n in names} if directional else {}
    for d in range(config.draws):
        labels = _sample(probs, _generator(config.seed, (d,), probs.device))
        loss = F.cross_entropy(logits, labels)
        grads = torch.autograd.grad(loss, [outputs[n] for n in names] + list(params),
                                    retain_graph=d + 1 < config.draws, allow_unused=True)
        for n, g in zip(names, grads):
            sq = float(g.float().pow(2).sum()) if g is not None else 0.0
            h[n] += rec.layers[n].out_rms ** 2 * positions * sq / 2 / config.draws
            if directional:
                rows = rec.layers[n].rows
                cotangents[n].append(torch.zeros(len(rows), rec.layers[n].shape.out_features, device=rows.device)
                                     if g is None else g.detach().reshape(-1, g.shape[-1])[rows].float())
        for p, g in zip(params, grads[len(names):]):
            if g is not None:
                gn[p] += positions * g.float().pow(2) / config.draws
    return FisherDraws(h, {"curvature_sum": sum(h.values()), "ld_fisher": 1.0}, gn, cotangents, positions)


def fprop_alignment(cotangents: Sequence[torch.Tensor], fprop_errors: Mapping[str, torch.Tensor], tokens: int,
                    positions: int, curvature: float, e_fwd: Mapping[str, float]) -> dict[str, float]:
    """{precision: directional LD / (h_l e_fwd)} for one layer and each precision of `fprop_errors` (the module
    docstring, "Directional LD"): from the Fisher draws' cotangents on the m sampled rows and each precision's
    forward error on those rows, the directional LD N/2 (M / m) E sum_t (g_t . e_t)^2, N `positions`, M `tokens`;
    1 where h_l e_fwd is 0."""
    out = {}
    for precision, err in fprop_errors.items():
        iso = curvature * e_fwd[precision]
        if not iso > 0:
            out[precision] = 1.0
            continue
        sq = math.fsum(float((g * err).sum(-1).double().pow(2).sum()) for g in cotangents) / len(cotangents)
        out[precision] = positions / 2 * tokens / err.shape[0] * sq / iso
    return out


def _curvature_method(config: DivergenceConfig, logits_fn: LogitsFn | None) -> str:
    if config.method == "auto":
        return "fisher" if logits_fn is not None else "batched"
    return config.method


def loss_curvature(model, layers: Mapping[str, nn.Linear], batch, loss_fn: LossFn, rec: Recording,
                   config: DivergenceConfig, seed: int, logits_fn: LogitsFn | None = None
                   ) -> tuple[dict[str, float], dict[str, float]]:
    """({layer: h_l}, diagnostics), see the module docstring."""
    method = _curvature_method(config, logits_fn)
    if method == "fisher":
        return _fisher_curvature(model, layers, batch, logits_fn, rec, config, seed)[:2]
    names = list(layers)
    rms = {n: rec.layers[n].out_rms for n in names}
    sigma = config.sigma
    h = {n: 0.0 for n in names}
    diag = {"ld_fisher": 0.0}
    if method == "per_layer":
        with torch.no_grad():
            for i, name in enumerate(names):
                for d in range(config.draws):
                    pair = []
                    for sign in (1.0, -1.0):
                        def add(mod, args, out, sign=sign, d=d, i=i):
                            return out + (sign * sigma * rms[name] * _noise(out, config.seed, d, i)).to(out.dtype)
                        pair.append(float(_run(model, batch, loss_fn, seed, [(layers[name], "forward", add)])))
                    h[name] += (pair[0] + pair[1] - 2 * rec.loss) / (2 * sigma**2) / config.draws
        return h, diag
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

            loss = _run(model, batch, loss_fn, seed, [(layers[n], "forward", add(n, i)) for i, n in enumerate(names)])
            grads = torch.autograd.grad(loss, [noisy[n] for n in names], allow_unused=True)
            for n, g in zip(names, grads):
                dots[n, sign] = float(torch.dot(zs[n].flatten(), g.float().flatten())) if g is not None else 0.0
            losses.append(float(loss.detach()))
        for n in names:
            h[n] += rms[n] * (dots[n, 1.0] - dots[n, -1.0]) / (4 * sigma) / config.draws
        fd_total += (losses[0] + losses[1] - 2 * rec.loss) / (2 * sigma**2) / config.draws
    diag["curvature_sum_from_loss_differences"] = fd_total
    diag["curvature_sum"] = sum(h.values())
    return h, diag


def _metric(rec: Recording, units: str) -> tuple[dict[nn.Parameter, torch.Tensor], float]:
    """The per-entry weight M of gradient noise in WD ({parameter: M}) and the normaliser it is divided by."""
    pre = rec.preconditioner
    if units == "loss":
        return pre.excess_loss_weight, 1.0
    if not pre.update_sq_norm > 0:
        raise FloatingPointError("the clean Adam update is zero; weight divergence is undefined")
    return {p: s.pow(2) for p, s in pre.scale.items()}, pre.update_sq_norm


def weight_sensitivity(model, layers: Mapping[str, nn.Linear], batch, loss_fn: LossFn, rec: Recording,
                       grad_in_rms: Mapping[str, float], config: DivergenceConfig, seed: int
                       ) -> tuple[dict[str, float], dict[str, float]]:
    """({layer: s_dgrad}, {layer: s_wgrad}), see the module docstring."""
    metric, norm = _metric(rec, config.wd_units)
    names = list(layers)
    s_wgrad = {}
    for n in names:
        w = layers[n].weight
        if w in metric:
            s_wgrad[n] = float(rec.layers[n].weight_grad.pow(2).mean() * metric[w].sum()) / norm
        else:  # not trained by the optimizer: its update cannot change
            s_wgrad[n] = 0.0
    params = list(metric)
    acc = {n: 0.0 for n in names}
    if config.method == "per_layer":
        inputs = {}

        def keep(name):
            def hook(mod, args):
                inputs[name] = args[0]
            return hook

        _run(model, batch, loss_fn, seed, [(layers[n], "pre", keep(n)) for n in names])  # builds the graph to x_l
        for i, n in enumerate(names):
            for d in range(config.draws):
                dg = torch.autograd.grad(inputs[n], params, grad_outputs=_noise(inputs[n], config.seed, d, i).to(
                    inputs[n].dtype), retain_graph=True, allow_unused=True)
                acc[n] += sum(float((metric[p] * g.float().pow(2)).sum()) for p, g in zip(params, dg)
                              if g is not None) / config.draws
    else:
        theta0 = [p.detach().clone() for p in params]
        theta_norm = float(torch.sqrt(sum(t.float().pow(2).sum() for t in theta0)))
        try:
            for d in range(config.draws):
                dirs = [metric[p].sqrt() * _noise(p, config.seed, d, j) * (rec.grads[p] != 0)
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
                    _run(model, batch, loss_fn, seed, [(layers[n], "pre", grab(n)) for n in names])
        finally:
            with torch.no_grad():
                for p, t0 in zip(params, theta0):
                    p.copy_(t0)
    s_dgrad = {n: grad_in_rms[n] ** 2 * acc[n] / norm for n in names}
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


def measure(model: nn.Module, layers: Mapping[str, nn.Linear], optimizer: torch.optim.Optimizer | None, batch,
            loss_fn: LossFn, candidates: Iterable[str], stats_config: StatsConfig = StatsConfig(),
            config: DivergenceConfig = DivergenceConfig(), step: int | None = None,
            logits_fn: LogitsFn | None = None, gradient_noise: bool = False,
            lr_ratios: Sequence[float] | None = None, lr_after: float = 0.0) -> PlannerStats:
    """Statistics -> quantization errors -> LD and WD sensitivities for every layer in `layers`.
    `logits_fn` enables the Fisher loss curvature (DivergenceConfig.method "auto" / "fisher");
    `gradient_noise` adds diagnostics["gradient_noise_loss"] (stats.gradient_noise_loss, a tensor batch);
    `lr_ratios`, the learning rate at each of the horizon's `wd_horizon` steps relative to the current one,
    prices WD's horizon under that schedule (planner.horizon) instead of at a constant learning rate; `lr_after`,
    the sum of those ratios over the run's steps after the horizon, prices WD at the run's end instead of the
    horizon's (planner.horizon, "The excess loss at the run's end")."""
    candidates = tuple(candidates)
    if lr_after and lr_ratios is None:
        raise ValueError("lr_after continues the horizon's schedule: pass lr_ratios too")
    if lr_ratios is not None:
        if config.wd_horizon is None:
            raise ValueError("lr_ratios schedule WD's horizon: set DivergenceConfig.wd_horizon")
        if len(lr_ratios) != config.wd_horizon:
            raise ValueError(f"lr_ratios has {len(lr_ratios)} steps, the horizon {config.wd_horizon}")
    seed = stats_config.seed
    fisher = _curvature_method(config, logits_fn) == "fisher"
    # lm_logits is the model's call on _lm_inputs: the Fisher draws reuse the statistics pass's forward when the loss
    # makes that call (the default loss of a causal LM does)
    lm_window = fisher and logits_fn is lm_logits and torch.is_tensor(batch) and batch.dim() == 2
    times = {}
    t = time.perf_counter()
    rec = record(model, layers, batch, loss_fn, optimizer, stats_config, sequence_grads=config.wgrad_signal_share,
                 logits_of=_lm_inputs(batch) if lm_window else None)
    times["time_record_s"] = time.perf_counter() - t
    weights = rec.preconditioner.excess_loss_weight
    # the horizon's Gauss-Newton diagonal from the Fisher draws when LD makes them, else from the gradient variance
    fisher_diagonal = config.wd_horizon is not None and fisher
    with high_precision(layers):
        t = time.perf_counter()
        if fisher:
            draws = _fisher_curvature(model, layers, batch, logits_fn, rec, config, seed,
                                      list(weights) if fisher_diagonal else ())
            curvature, diag, gn = draws.curvature, draws.diagnostics, draws.gauss_newton
            rec.logits_graph = None  # frees the statistics pass's graph
        else:
            curvature, diag = loss_curvature(model, layers, batch, loss_fn, rec, config, seed, logits_fn)
            draws = None
        times["time_loss_divergence_s"] = time.perf_counter() - t
    t = time.perf_counter()
    errors, alignment = {}, {}
    for n, r in rec.layers.items():
        exact, approx = gemm_outputs(r, candidates, seed)
        errors[n] = relative_errors(r, candidates, exact, approx)
        if draws is not None and draws.cotangents:
            fprop_errors = {p: a["fprop"] - exact["fprop"] for p, a in approx.items()}
            alignment[n] = fprop_alignment(draws.cotangents[n], fprop_errors, r.shape.tokens, draws.positions,
                                           curvature[n], {p: e["fprop"] for p, e in errors[n].items()})
    diag["ld_directional"] = 1.0 if alignment else 0.0
    grad_in_rms = {n: float((r.dy @ r.weight.float()).pow(2).mean().sqrt()) for n, r in rec.layers.items()}
    times["time_errors_s"] = time.perf_counter() - t
    variance = None
    if gradient_noise or (config.wd_horizon is not None and not fisher_diagonal):
        t = time.perf_counter()
        variance = gradient_variance(model, layers, batch, loss_fn, rec, seed)
        times["time_gradient_variance_s"] = time.perf_counter() - t
    if config.wd_horizon is not None:
        if not fisher_diagonal:  # the linear layers' rows are the positions the loss averages over
            positions = next(iter(rec.layers.values())).shape.tokens
            gn = {p: positions * v for p, v in variance.items()}
        table = HorizonTable(lr_ratios, lr_after) if lr_ratios is not None else None
        horizon = {}
        for p, c in weights.items():  # no gradient on this batch: G_ii = 0
            g = gn.get(p, 0.0)
            horizon[p] = c * (-torch.expm1(-8 * config.wd_horizon * c * g) if lr_ratios is None else
                              table(4 * c * g))  # a = lr D G = 4 c G
        rec.preconditioner.excess_loss_weight = horizon
    # the minibatch's own gradient noise, priced by the same excess-loss weights as WD
    noise = gradient_noise_loss(variance, rec) if gradient_noise else None
    with high_precision(layers):
        t = time.perf_counter()
        s_dgrad, s_wgrad = weight_sensitivity(model, layers, batch, loss_fn, rec, grad_in_rms, config, seed)
        times["time_weight_divergence_s"] = time.perf_counter() - t
    if config.wgrad_signal_share:
        if rec.sequences is None:
            warnings.warn("wgrad_signal_share: the batch's sequences are not the leading dimension of every planned "
                          "layer's input (or there is only one), so wgrad's WD keeps its price; pass "
                          "DivergenceConfig(wgrad_signal_share=False) to silence this", stacklevel=2)
        else:
            share = weighted_signal_share(signal_fractions(rec, layers), s_wgrad, errors)
            s_wgrad = {n: v * share for n, v in s_wgrad.items()}
            diag["wgrad_signal_share"] = share
    out = []
    for n, r in rec.layers.items():
        out.append(LayerStats(
            shape=r.shape, out_rms=r.out_rms, grad_out_rms=r.grad_out_rms, grad_in_rms=grad_in_rms[n],
            weight_grad_rms=float(r.weight_grad.pow(2).mean().sqrt()), curvature=curvature[n],
            s_dgrad=s_dgrad[n], s_wgrad=s_wgrad[n], errors=errors[n], fprop_alignment=alignment.get(n, {})))
    diag.update(times)
    diag["sampled_rows"] = float(next(iter(rec.layers.values())).x.shape[0])
    if noise is not None:
        diag["gradient_noise_loss"] = noise
    if not all(math.isfinite(v) for v in curvature.values()):
        raise FloatingPointError("a loss curvature estimate is not finite")
    return PlannerStats(tuple(out), rec.loss, step, rec.preconditioner.source, diag, config.wd_units)
