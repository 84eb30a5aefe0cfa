"""A layer's forward GEMM in FP4: the loss change it costs at once, its actual output error, and LD along that error.

The planner's LD prices a layer's forward error as isotropic noise of the error's energy. `structured_ld` prices it
along the layer's actual FP4 output error instead, with the same Gauss-Newton curvature the Fisher draws estimate;
`StructuredLD` makes a planner solve with it (the quality grid's snip_struct).
"""

from __future__ import annotations

import dataclasses

import torch
from torch.nn import functional as F

from planner import DivergenceConfig, LayerStats, PlannerStats, fisher_labels, high_precision, lm_logits
from snip_ops import LinearPrecision
from snip_train.state import set_sr_counters, sr_counters

FP4_FORWARD = LinearPrecision(fprop="fp4", dgrad="bf16", wgrad="bf16")  # a layer's forward GEMM alone in FP4


def fp4_forward_loss_changes(model, layers, batches, sets: dict[str, list[str]]) -> dict[str, list[float]]:
    """{set name: [loss with the set's layers' forward GEMMs in FP4 (round to nearest) minus bf16, per batch]}, every
    other GEMM in bf16; the layers' precisions are put back after."""
    out = {}
    with torch.no_grad(), high_precision(layers):
        base = [float(model.loss(x)) for x in batches]
        for key, names in sets.items():
            for n in names:
                layers[n].set_precision(FP4_FORWARD)
            try:
                out[key] = [float(model.loss(x)) - b for x, b in zip(batches, base)]
            finally:
                for n in names:
                    layers[n].set_precision("bf16")
    return out


def fp4_output_errors(model, layers, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(logits, {layer: its bf16 output, in the graph}, {layer: its FP4 forward's output minus the bf16 one on the
    same input}) on a window batch, every other GEMM in bf16. The SR counters are put back: the forward GEMMs round
    to nearest, but a branch must draw the same bits however often it is measured."""
    inputs, outputs = {}, {}

    def keep(name):
        def hook(mod, args, y):
            inputs[name], outputs[name] = args[0].detach(), y
        return hook

    handles = [m.register_forward_hook(keep(n)) for n, m in layers.items()]
    try:
        with high_precision(layers):
            logits = lm_logits(model, batch)
    finally:
        for h in handles:
            h.remove()
    counters = sr_counters(model)
    errors = {}
    try:
        with torch.no_grad():
            for n, m in layers.items():
                saved = m.precision
                m.set_precision(FP4_FORWARD)
                try:
                    errors[n] = m(inputs[n]).float() - outputs[n].detach().float()
                finally:
                    m.set_precision(saved)
    finally:
        set_sr_counters(model, counters)
    return logits, outputs, errors


def structured_ld(model, layers, batch, draws: int, seed: int = 0) -> dict[str, float]:
    """{layer: 1/2 e^T G e}, the Gauss-Newton form of LD along the layer's actual FP4 forward error e on `batch`
    instead of isotropic noise of e's energy (with isotropic e it is LD): N/2 E_s sum_b (g_s,b . e_b)^2 over `draws`
    sampled-label cotangents g_s at the layer's output (the planner's Fisher draws), summed per sequence b
    (independent sequences: the cross-sequence terms have mean zero)."""
    logits, outputs, errors = fp4_output_errors(model, layers, batch)
    logits = logits.reshape(-1, logits.shape[-1]).float()
    probs = logits.detach().softmax(-1)
    names = list(layers)
    out = {n: 0.0 for n in names}
    for d in range(draws):
        labels = fisher_labels(probs, seed, d)
        grads = torch.autograd.grad(F.cross_entropy(logits, labels), [outputs[n] for n in names],
                                    retain_graph=d + 1 < draws)
        for n, g in zip(names, grads):
            per_sequence = (g.float() * errors[n]).flatten(1).sum(1)
            out[n] += logits.shape[0] / 2 * float(per_sequence.pow(2).sum()) / draws
    return out


class StructuredLD:
    """Planner hooks (snip_train.planning.make_hooks) whose planner solves with every layer's curvature times
    structured_ld / LD in FP4, measured on each re-plan's calibration batch; otherwise the hooks they wrap."""

    def __init__(self, hooks):
        self.hooks = hooks

    def __getattr__(self, name):
        return getattr(self.hooks, name)

    def on_setup(self, model, opt) -> None:
        self.hooks.on_setup(model, opt)
        measure = self.hooks.planner.measure

        def adjusted(batch, *args, **kwargs) -> PlannerStats:
            return self.adjust(measure(batch, *args, **kwargs), batch)
        self.hooks.planner.measure = adjusted

    def on_step(self, step, model, batch):
        return self.hooks.on_step(step, model, batch)

    def adjust(self, stats: PlannerStats, batch) -> PlannerStats:
        """`stats` (measured on `batch`) with every layer's curvature, so its LD, scaled to its structured LD in FP4;
        a layer without an isotropic LD is left as measured."""
        planner = self.hooks.planner
        struct = structured_ld(planner.model, planner.layers, batch, DivergenceConfig().draws)

        def scaled(s: LayerStats) -> LayerStats:
            iso = s.ld("fp4")
            return dataclasses.replace(s, curvature=s.curvature * (struct[s.name] / iso)) if iso > 0 else s
        return dataclasses.replace(stats, layers=tuple(scaled(s) for s in stats.layers))
