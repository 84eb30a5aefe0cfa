"""Loss divergence and weight divergence (DESIGN.md §4.3-4.4), batched over all layers.

Notation: y_l, x_l, dx_l = dy_l w_l are layer l's output, input and dgrad output on the calibration
batch; rms(.) is a tensor's root mean square; z is standard Gaussian noise of the tensor's shape.

Loss divergence.  The definition: with n = sigma rms(y_l) z injected into y_l alone,
    h_l = E[L(y+n) + L(y-n) - 2 L(y)] / (2 sigma^2)  =  rms(y_l)^2 tr(H_ll) / 2 + O(sigma^2),
H_ll the block of the loss Hessian w.r.t. y_l, and LD(l, p) = h_l e_fwd(l, p).
  * `method="per_layer"` computes exactly that: 2 forwards per layer per draw.
  * `method="batched"` (default) injects independent noise n_l into *every* layer at once, once with
    +n and once with -n, and backpropagates both losses to the noisy outputs:
        n_l . (g_l(+n) - g_l(-n)) = 2 n_l . (H n)_l + O(sigma^4)
    and E[n_l . (H n)_l] = E[n_l^T H_ll n_l] because the cross terms n_l^T H_lm n_m (m != l) have
    mean zero for independent noise. So h_l = E[n_l . (g_l(+n) - g_l(-n))] / (4 sigma^2): the same
    quantity, for all layers from 2 forward/backward passes per draw. The loss values of the same
    pair give the sum over layers, (L+ + L- - 2L) / (2 sigma^2) ~ sum_l h_l: kept as a diagnostic.

Weight divergence.  With P = d(update)/d(grad) the Adam preconditioner (stats.adam_preconditioner)
and U^2 the squared norm of the clean update:
  * wgrad: noise nu of relative size e on dW_l changes the update by P nu, so
        s_wgrad(l) = rms(dW_l)^2 sum_{i in W_l} P_i^2 / U^2        (closed form, no pass)
  * dgrad: noise nu = rms(dx_l) z on dx_l reaches every upstream parameter as a cotangent on x_l:
    delta_g = J_l^T nu with J_l = d x_l / d theta, and
        s_dgrad(l) = rms(dx_l)^2 E||P J_l^T z||^2 / U^2 = rms(dx_l)^2 tr(J_l P^2 J_l^T) / U^2.
    `per_layer` draws z and backpropagates it from x_l (one backward per layer per draw).
    `batched` uses tr(J P^2 J^T) = E_w ||J_l P w||^2 over w ~ N(0, I) in parameter space: one
    antithetic pair of forwards with theta +- h P w gives J_l P w = (x_l(+) - x_l(-)) / (2h) for
    every layer at once. Parameter entries whose gradient is exactly zero on this batch (e.g.
    embedding rows of absent tokens) get no perturbation: they reach no x_l, and their huge
    1/(sqrt(v)+eps) would otherwise force a tiny step h.
Per unit relative noise energy, WD(l, p) = s_dgrad e_dgrad(l, p) + s_wgrad e_wgrad(l, p).

Cost (batched, D = draws): 2D forward+backward passes for LD, 2D forwards for WD, plus the stats
pass. Extra memory: the noise of every layer output during an LD pass (one activation-sized tensor
per layer), and two parameter-sized copies (theta and the direction P w) during WD.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Literal, Mapping

import torch
from torch import nn

from .qerror import gemm_errors
from .stats import (LayerStats, LossFn, PlannerStats, Recording, StatsConfig, high_precision, isolated_rng,
                    record)

__all__ = ["DivergenceConfig", "loss_curvature", "weight_sensitivity", "measure"]


@dataclass(frozen=True)
class DivergenceConfig:
    sigma: float = 0.05        # relative size of the output noise for loss curvature
    draws: int = 2             # antithetic pairs per estimate
    param_step: float = 1e-3   # ||h P w|| / ||theta||, the parameter perturbation of the batched WD
    method: Literal["batched", "per_layer"] = "batched"
    seed: int = 0

    def __post_init__(self):
        if not 0 < self.sigma < 1:
            raise ValueError(f"sigma must be in (0, 1), got {self.sigma}")
        if self.draws < 1:
            raise ValueError(f"draws must be >= 1, got {self.draws}")
        if not 0 < self.param_step < 0.1:
            raise ValueError(f"param_step must be in (0, 0.1), got {self.param_step}")
        if self.method not in ("batched", "per_layer"):
            raise ValueError(f"method must be 'batched' or 'per_layer', got {self.method!r}")


def _noise(like: torch.Tensor, seed: int, *key: int) -> torch.Tensor:
    """Standard normal noise of `like`'s shape, a pure function of (seed, key)."""
    h = seed
    for k in key:
        h = (h * 1_000_003 + k + 1) % (2**61 - 1)
    gen = torch.Generator(device=like.device).manual_seed(h)
    return torch.randn(like.shape, generator=gen, device=like.device, dtype=torch.float32)


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


def loss_curvature(model, layers: Mapping[str, nn.Linear], batch, loss_fn: LossFn, rec: Recording,
                   config: DivergenceConfig, seed: int) -> tuple[dict[str, float], dict[str, float]]:
    """({layer: h_l}, diagnostics), see the module docstring."""
    names = list(layers)
    rms = {n: rec.layers[n].out_rms for n in names}
    sigma = config.sigma
    h = {n: 0.0 for n in names}
    diag = {}
    if config.method == "per_layer":
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


def weight_sensitivity(model, layers: Mapping[str, nn.Linear], batch, loss_fn: LossFn, rec: Recording,
                       grad_in_rms: Mapping[str, float], config: DivergenceConfig, seed: int
                       ) -> tuple[dict[str, float], dict[str, float]]:
    """({layer: s_dgrad}, {layer: s_wgrad}), see the module docstring."""
    pre = rec.preconditioner
    u2 = pre.update_sq_norm
    if not u2 > 0:
        raise FloatingPointError("the clean Adam update is zero; weight divergence is undefined")
    names = list(layers)
    s_wgrad = {}
    for n in names:
        w = layers[n].weight
        if w in pre.scale:
            s_wgrad[n] = float(rec.layers[n].weight_grad.pow(2).mean() * pre.scale[w].pow(2).sum()) / u2
        else:  # not trained by the optimizer: its update cannot change
            s_wgrad[n] = 0.0
    params = list(pre.scale)
    acc = {n: 0.0 for n in names}
    if config.method == "per_layer":
        inputs = {}

        def keep(name):
            def hook(mod, args):
                inputs[name] = args[0]
            return hook

        loss = _run(model, batch, loss_fn, seed, [(layers[n], "pre", keep(n)) for n in names])
        del loss
        for i, n in enumerate(names):
            for d in range(config.draws):
                dg = torch.autograd.grad(inputs[n], params, grad_outputs=_noise(inputs[n], config.seed, d, i).to(
                    inputs[n].dtype), retain_graph=True, allow_unused=True)
                acc[n] += sum(float((pre.scale[p] * g.float()).pow(2).sum()) for p, g in zip(params, dg)
                              if g is not None) / config.draws
    else:
        theta0 = [p.detach().clone() for p in params]
        theta_norm = float(torch.sqrt(sum(t.float().pow(2).sum() for t in theta0)))
        try:
            for d in range(config.draws):
                dirs = [pre.scale[p] * _noise(p, config.seed, d, j) * (rec.grads[p] != 0) for j, p in enumerate(params)]
                dir_norm = float(torch.sqrt(sum(v.pow(2).sum() for v in dirs)))
                step = config.param_step * theta_norm / dir_norm
                plus = {}

                def grab(name, store):
                    def hook(mod, args):
                        x = args[0].detach().float()
                        if store:
                            plus[name] = x
                        else:
                            acc[name] += float((plus.pop(name) - x).pow(2).sum()) / (2 * step) ** 2 / config.draws
                    return hook

                for sign in (1.0, -1.0):
                    with torch.no_grad():
                        for p, t0, v in zip(params, theta0, dirs):
                            p.copy_(t0 + (sign * step * v).to(t0.dtype))
                        _run(model, batch, loss_fn, seed, [(layers[n], "pre", grab(n, sign > 0)) for n in names])
        finally:
            with torch.no_grad():
                for p, t0 in zip(params, theta0):
                    p.copy_(t0)
    s_dgrad = {n: grad_in_rms[n] ** 2 * acc[n] / u2 for n in names}
    return s_dgrad, s_wgrad


def measure(model: nn.Module, layers: Mapping[str, nn.Linear], optimizer: torch.optim.Optimizer | None, batch,
            loss_fn: LossFn, candidates: Iterable[str], stats_config: StatsConfig = StatsConfig(),
            config: DivergenceConfig = DivergenceConfig(), step: int | None = None) -> PlannerStats:
    """Statistics -> quantization errors -> LD and WD sensitivities for every layer in `layers`."""
    candidates = tuple(candidates)
    seed = stats_config.seed
    times = {}
    t = time.perf_counter()
    rec = record(model, layers, batch, loss_fn, optimizer, stats_config)
    times["time_record_s"] = time.perf_counter() - t
    t = time.perf_counter()
    errors = {n: gemm_errors(r, candidates, seed) for n, r in rec.layers.items()}
    grad_in_rms = {n: float((r.dy @ r.weight.float()).pow(2).mean().sqrt()) for n, r in rec.layers.items()}
    times["time_errors_s"] = time.perf_counter() - t
    with high_precision(layers):
        t = time.perf_counter()
        curvature, diag = loss_curvature(model, layers, batch, loss_fn, rec, config, seed)
        times["time_loss_divergence_s"] = time.perf_counter() - t
        t = time.perf_counter()
        s_dgrad, s_wgrad = weight_sensitivity(model, layers, batch, loss_fn, rec, grad_in_rms, config, seed)
        times["time_weight_divergence_s"] = time.perf_counter() - t
    out = []
    for n, r in rec.layers.items():
        out.append(LayerStats(
            shape=r.shape, out_rms=r.out_rms, grad_out_rms=r.grad_out_rms, grad_in_rms=grad_in_rms[n],
            weight_grad_rms=float(r.weight_grad.pow(2).mean().sqrt()), curvature=curvature[n],
            s_dgrad=s_dgrad[n], s_wgrad=s_wgrad[n], errors=errors[n]))
    diag.update(times)
    diag["sampled_rows"] = float(next(iter(rec.layers.values())).x.shape[0])
    return PlannerStats(tuple(out), rec.loss, step, rec.preconditioner.source, diag)
