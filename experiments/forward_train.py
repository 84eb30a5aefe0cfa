"""How a forward GEMM's FP4 error costs through training: which of Adam's moments carries it, and whether it is the
error's bias or its noise; and a price of that bias against the measured cost.

    python -m experiments.forward_train --phases 100 --blocks 0,2 --seeds 0,1,2,3 --workers 2

Early in training most of what a block's FP4 forward error costs comes through the weights it trains, not through
the loss of the error itself, which is what LD prices (experiments.scale: fprop_train, the error in the training
steps only and the evaluation exact, costs 88-95% of the whole forward gap at the 100-step checkpoint, 7-70x the
block's LD). Routes: from a bf16 checkpoint, `--steps` steps with one transformer block's forward error amplified
`--amplify` times (experiments.amplified_error.AmplifiedError, in the training steps only, the evaluation exact),
every step's AdamW update (torch.optim.AdamW's arithmetic, the loop's clipped gradients) fed from
  * exact: the exact gradient (no error anywhere): the reference every route's gap is taken against;
  * both: the perturbed gradient, in the first moment m and the second v: the error's whole cost (the scale study's
    fprop_train);
  * first_moment: m from the perturbed gradient, v from the exact one;
  * second_moment: m exact, v perturbed: what the error costs by inflating v alone (smaller steps);
  * other_batch: m from the exact gradient plus the error's gradient change on another training batch (the same
    weights), v exact: the same bias and noise, the noise independent of the batch's own gradient;
  * two_batch_mean: m from the exact gradient plus the mean of the change on the batch and on the other one, v exact:
    the same bias, half the noise's variance;
  * alternating_sign: as both, the error's sign flipped every other step: the part of the gradient change that is
    odd in the error (linear, to first order) alternates and Adam's m averages it away; the even part (second order,
    the gradient of the loss the error costs) stays.
A cost that the error's noise carries halves from other_batch to two_batch_mean; one that its bias carries does not.
One that the bias's odd part carries vanishes under alternating_sign; one that its even part carries does not.
With `--rounding sr` the forward GEMM's operands (activations and weight) round stochastically instead of to nearest
(fresh bits every step): the error's part that is odd in it then has mean zero, bias turned into noise. Beside the
routes, per checkpoint: the energy of the FP4 forward error rounded stochastically over that rounded to nearest, per
layer on the calibration batch (what the even part scales with).

Prices (`--price-batches` calibration batches at each phase, every block, the error not amplified): the gradient change
dg(s) of the block's forward error times s = +1 and -1, its odd part (dg(1) - dg(-1)) / 2 (linear in the error) and
the whole dg(1), each priced as the drift it gives Adam over the branch in a diagonal quadratic model, the Fisher
diagonal G as the curvature and Adam's v as the preconditioner: per parameter, b^2 (1 - exp(-a T))^2 / (2 G) with
a = lr D G, D = 1 / (sqrt(v) + eps), lr the branch's mean and b^2 the squared mean over the batches without its
noise (the mean over pairs of distinct batches). LD: the planner's, summed over the block. Beside them, on the tiny
preset, the scale study's --blocks per-block truths (cpu-planner-scale-blocks.json, divided by k^2), and the block's
LD 100 steps on along the bf16 trajectory from that file (LD later: foresight) as LD later + max(0, LD later - LD),
the end value plus the rise: training under the error follows the gradient of L + LD, which to first order costs the
exact loss what the exact trajectory raises LD by. Results: bench/results/cpu-planner-<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import multiprocessing
import statistics
from concurrent.futures import ProcessPoolExecutor

import torch
from torch.nn import functional as F

from experiments import results
from experiments.amplified_error import AmplifiedError
from experiments.common import (CACHE, RUN, add_run_arguments, branch_config, calibration_batch, check_cache_numerics,
                                checkpoint, continue_from, in_block, ints, mean_se, model_at)
from planner import (DivergenceConfig, PlannedModel, StatsConfig, block_index, fisher_labels, high_precision, lm_logits,
                     measure)
from snip_ops import gemm as snip_gemm
from snip_ops.formats import GemmRecipe, Rounding, recipe
from snip_ops.module import layer_seed
from snip_train.data import TokenData
from snip_train.train import learning_rates

# route: (the gradient Adam's first moment sees, the one its second moment sees); "exact", "own" (the batch's,
# perturbed), "other" (the exact gradient plus the error's change on another batch), "mean2" (plus the mean of the
# batch's change and the other's)
ROUTES = {
    "exact": ("exact", "exact"),
    "both": ("own", "own"),
    "first_moment": ("own", "exact"),
    "second_moment": ("exact", "own"),
    "other_batch": ("other", "exact"),
    "two_batch_mean": ("mean2", "exact"),
    "alternating_sign": ("own", "own"),
}
ALTERNATING = ("alternating_sign",)  # routes whose error changes sign every step
OTHER_BATCH_SEED = 10_000  # the other batches: a generator of their own per seed, none of the branch's
FIRST_PRICE_BATCH = 100  # the priced batches: calibration_batch(100 + i), none of them the calibration batch
ROUNDINGS = ("rne", "sr")


def forward_recipe(rounding: str) -> GemmRecipe:
    """The planner's FP4 recipe, its forward operands rounded to nearest ("rne", as planned) or stochastically
    ("sr")."""
    fp4 = recipe("fp4")
    if rounding == "rne":
        return fp4
    if rounding != "sr":
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    return dataclasses.replace(fp4, name="fp4_sr_forward", act=dataclasses.replace(fp4.act, rounding=Rounding.SR),
                               weight=dataclasses.replace(fp4.weight, rounding=Rounding.SR))


def clipped(grads: list[torch.Tensor], max_norm: float) -> list[torch.Tensor]:
    """`grads` scaled as torch.nn.utils.clip_grad_norm_ scales a step's gradients (the training loop's clipping)."""
    norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
    return [g * min(1.0, max_norm / (norm + 1e-6)) for g in grads]


@contextlib.contextmanager
def error_switched(error: AmplifiedError, on: bool):
    """`error` on or off for the block, as it was afterwards."""
    was, error.enabled = error.enabled, on
    try:
        yield
    finally:
        error.enabled = was


def loss_grads(model, params, batch, grad_clip: float) -> list[torch.Tensor]:
    """The clipped gradients of the model's loss on `batch` (as the training loop clips them)."""
    return clipped(list(torch.autograd.grad(model.loss(batch), params)), grad_clip)


class RoutedError(AmplifiedError):
    """Hooks for experiments.common.continue_from: one block's forward error in the training steps, and the optimizer's
    step replaced by AdamW's fed as the route says (ROUTES)."""

    def __init__(self, route: str, amplify: float, block: int, seed: int, grad_clip: float, rounding: str = "rne"):
        super().__init__("fprop", forward_recipe(rounding), amplify, in_evaluation=False, block=block)
        self.route, (self.first, self.second) = route, ROUTES[route]
        self.enabled = route != "exact"  # the loop's own backward then gives the exact gradient
        self.grad_clip, self.amplitude = grad_clip, amplify
        self.other_gen = torch.Generator().manual_seed(OTHER_BATCH_SEED + seed)
        self.data = TokenData.from_path(None, max_bytes=RUN["max_bytes"])

    def on_setup(self, model, opt) -> None:
        super().on_setup(model, opt)
        self.model, self.opt = model, opt
        self.params = [p for group in opt.param_groups for p in group["params"]]
        self.groups = [group for group in opt.param_groups for _ in group["params"]]  # each parameter's
        opt.step = self.adam_step

    def grads(self, batch, with_error: bool) -> list[torch.Tensor]:
        with error_switched(self, with_error):
            return loss_grads(self.model, self.params, batch, self.grad_clip)

    def on_step(self, step, model, batch) -> None:
        super().on_step(step, model, batch)
        if self.route in ALTERNATING:
            self.amplify = self.amplitude * (-1.0) ** step
        self.exact = self.other_change = None
        if self.route == "exact" or {self.first, self.second} == {"own"}:  # the loop's own gradient is all they need
            return
        self.exact = self.grads(batch, False)
        if {"other", "mean2"} & {self.first, self.second}:
            other = self.data.get_batch("train", RUN["batch_size"], RUN["seq_len"], self.other_gen)
            self.other_change = [a - b for a, b in zip(self.grads(other, True), self.grads(other, False))]

    def fed(self, source: str, i: int, grad: torch.Tensor) -> torch.Tensor:
        """The gradient of parameter i that `source` names; `grad`: the loop's (clipped) gradient of this step."""
        if self.exact is None or source == "own":
            return grad
        exact = self.exact[i]
        if source == "exact":
            return exact
        own_change, other_change = grad - exact, self.other_change[i]
        return exact + (other_change if source == "other" else 0.5 * (own_change + other_change))

    @torch.no_grad()
    def adam_step(self) -> None:
        """torch.optim.AdamW's update (decoupled weight decay, bias-corrected moments), m and v fed as routed."""
        for i, (p, group) in enumerate(zip(self.params, self.groups)):
            beta1, beta2 = group["betas"]
            lr, eps, weight_decay = group["lr"], group["eps"], group["weight_decay"]
            m_grad, v_grad = self.fed(self.first, i, p.grad), self.fed(self.second, i, p.grad)
            state = self.opt.state[p]
            if not state:  # as torch.optim.AdamW starts a parameter's state
                state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
            state["step"] += 1
            t = float(state["step"])
            p.mul_(1 - lr * weight_decay)
            state["exp_avg"].lerp_(m_grad, 1 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(v_grad, v_grad, value=1 - beta2)
            denom = (state["exp_avg_sq"].sqrt() / (1 - beta2 ** t) ** 0.5).add_(eps)
            p.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1 ** t))


@dataclasses.dataclass(frozen=True)
class RouteRun:
    phase: int
    block: int
    route: str
    seed: int
    steps: int
    amplify: float
    eval_batches: int
    rounding: str = "rne"

    @property
    def key(self) -> str:
        if self.route == "exact":  # the reference has no error, in any block, rounded either way
            return f"{self.phase}/-/exact/{self.seed}/{self.steps}/{self.amplify:g}/e{self.eval_batches}"
        rounding = "" if self.rounding == "rne" else f"/{self.rounding}"
        return (f"{self.phase}/{self.block}/{self.route}/{self.seed}/{self.steps}/{self.amplify:g}/e{self.eval_batches}"
                + rounding)


def run_route(run: RouteRun) -> float:
    """The branch's final validation loss."""
    torch.set_num_threads(1)
    hooks = RoutedError(run.route, run.amplify, run.block, run.seed, RUN["grad_clip"], run.rounding)
    return continue_from(checkpoint(run.phase), run.steps, run.seed, hooks=hooks, evals=1,
                         eval_batches=run.eval_batches)["final_val_loss"]


def route_rows(args) -> list[dict]:
    """Each (phase, block, route)'s gap to the exact route per seed, and its share of route both's."""
    cache = CACHE / "forward-train-routes.json"
    done = results.read_cache(cache)
    runs = {(phase, block, route, seed): RouteRun(phase, block, route, seed, args.steps, args.amplify,
                                                  args.eval_batches, args.rounding)
            for phase in args.phases for block in args.blocks for route in args.routes for seed in args.seeds}
    for phase in args.phases:  # before the workers start, so that they only read it
        checkpoint(phase)
    todo = list({r.key: r for r in runs.values() if r.key not in done}.values())
    for phase in sorted({r.phase for r in todo}):  # the workers train as this process does, with one thread
        check_cache_numerics(done, cache, phase)
    with ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for r, loss in zip(todo, pool.map(run_route, todo)):
            done[r.key] = loss
            results.write_cache(cache, done)
            print(f"{r.key}: val {loss:.5f}", flush=True)
    rows = []
    for phase in args.phases:
        for block in args.blocks:
            gaps = {route: [done[runs[phase, block, route, s].key] - done[runs[phase, block, "exact", s].key]
                            for s in args.seeds] for route in args.routes if route != "exact"}
            whole = statistics.mean(gaps["both"])
            for route, per_seed in gaps.items():
                mean, se = mean_se(per_seed)
                rows.append({"phase": phase, "block": block, "route": route, "gaps": per_seed, "mean_gap": mean,
                             "standard_error": se, "share_of_both": mean / whole if whole else float("nan")})
    return rows


def sr_energy_ratios(phase: int) -> dict[str, float]:
    """{layer: the mean squared FP4 forward error on the calibration batch rounded stochastically (the layer's own
    bits, step 0) over that rounded to nearest} at the checkpoint."""
    model, _, layers = model_at(checkpoint(phase))
    inputs = {}
    handles = [m.register_forward_hook(lambda mod, args, out, name=name: inputs.__setitem__(
        name, args[0].detach().reshape(-1, mod.in_features).float())) for name, m in layers.items()]
    with torch.no_grad():
        model.loss(calibration_batch())
    for h in handles:
        h.remove()
    ratios = {}
    for name, module in layers.items():
        x, w = inputs[name], module.weight.detach().float()
        exact = snip_gemm.fp32_mm(x, w.t())
        energy = {r: float((snip_gemm.fprop(x, w, forward_recipe(r), seed=layer_seed(name), emulate=True)
                            - exact).pow(2).mean()) for r in ROUNDINGS}
        ratios[name] = energy["sr"] / energy["rne"]
    return ratios


def pair_mean_of_squares(samples: list[list[torch.Tensor]], j: int) -> torch.Tensor:
    """The mean over pairs of distinct samples of a_i * a_k, elementwise, for parameter j: the squared mean
    without its noise (unbiased)."""
    stack = torch.stack([s[j] for s in samples])
    total = stack.sum(0)
    return (total * total - (stack * stack).sum(0)) / (len(samples) * (len(samples) - 1))


def drift_price(changes: list[list[torch.Tensor]], fisher, preconditioner, lr: float, steps: int) -> float:
    """The loss Adam's drift along the mean gradient change costs over `steps` steps in the diagonal quadratic model
    (see the module's docstring)."""
    total = 0.0
    for j, (g, d) in enumerate(zip(fisher, preconditioner)):
        a = lr * d * g
        total += float((pair_mean_of_squares(changes, j) * torch.expm1(-a * steps).pow(2)
                        / (2 * g.clamp_min(1e-30))).sum())
    return total


def price_rows(args) -> list[dict]:
    truths = {}
    for r in results.scale_block_rows():
        if r["gemm"] in ("fprop", "fprop_train") and r["block"] is not None:
            truths[r["phase"], r["gemm"], r["block"]] = r["mean_gap"] / r["amplify"] ** 2
            truths[r["phase"], "ld_later", r["block"]] = r["predicted_later"] / r["amplify"] ** 2
    rows = []
    for phase in args.phases:
        ckpt = checkpoint(phase)
        model, opt, layers = model_at(ckpt)
        params = [p for group in opt.param_groups for p in group["params"]]
        stats = measure(PlannedModel(model, layers, opt, lambda m, b: m.loss(b), lm_logits), calibration_batch(),
                        ("fp4",), StatsConfig(), DivergenceConfig())  # its LD
        batches = [calibration_batch(FIRST_PRICE_BATCH + i) for i in range(args.price_batches)]
        blocks = sorted({block_index(name) for name in layers})
        errors = {(block, s): AmplifiedError("fprop", "fp4", s, in_evaluation=False, block=block)
                  for block in blocks for s in (1.0, -1.0)}
        for e in errors.values():
            e.on_setup(model, opt)
            e.enabled = False

        def grads(batch, error: AmplifiedError) -> list[torch.Tensor]:
            with error_switched(error, True):
                return loss_grads(model, params, batch, RUN["grad_clip"])
        whole = {block: [] for block in blocks}
        odd = {block: [] for block in blocks}
        for batch in batches:
            exact = loss_grads(model, params, batch, RUN["grad_clip"])  # every error off
            for block in blocks:
                plus, minus = grads(batch, errors[block, 1.0]), grads(batch, errors[block, -1.0])
                whole[block].append([p - e for p, e in zip(plus, exact)])
                odd[block].append([(p - m) / 2 for p, m in zip(plus, minus)])
        fisher = [torch.zeros_like(p) for p in params]
        for i, batch in enumerate(batches):  # one label draw per batch, from the model's own predictions
            with high_precision(layers):
                logits = lm_logits(model, batch).flatten(0, -2).float()
            labels = fisher_labels(logits.detach().softmax(-1), 0, i)
            for f, g in zip(fisher, torch.autograd.grad(F.cross_entropy(logits, labels), params)):
                f += logits.shape[0] * g.float().pow(2) / len(batches)
        beta2, eps = opt.param_groups[0]["betas"][1], opt.param_groups[0]["eps"]
        preconditioner = [1.0 / ((opt.state[p]["exp_avg_sq"] / (1 - beta2 ** float(opt.state[p]["step"]))).sqrt() + eps)
                          for p in params]
        lrs = learning_rates(branch_config(ckpt, args.steps, 0))
        lr = statistics.mean(lrs(s) for s in range(args.steps))
        for block in blocks:
            ld = sum(s.ld("fp4") for s in stats.layers if in_block(s.name, block))
            ld_later = truths.get((phase, "ld_later", block))
            rows.append({"phase": phase, "block": block, "ld": ld, "ld_later": ld_later,
                         "end_and_growth": None if ld_later is None else ld_later + max(0.0, ld_later - ld),
                         "drift_whole": drift_price(whole[block], fisher, preconditioner, lr, args.steps),
                         "drift_odd": drift_price(odd[block], fisher, preconditioner, lr, args.steps),
                         "truth_train": truths.get((phase, "fprop_train", block)),
                         "truth": truths.get((phase, "fprop", block))})
    return rows


def markdown(args, routes: list[dict], prices: list[dict], energy: dict[int, dict[str, float]]) -> str:
    def num(v, fmt=".5f"):
        return "-" if v is None else format(v, fmt)

    def ratio(a, b):
        return "-" if a is None or b is None or b == 0 else f"{a / b:.1f}"
    rounding = "rounded stochastically" if args.rounding == "sr" else "rounded to nearest"
    md = [f"Tiny preset. Routes: from each bf16 checkpoint, {args.steps} steps (cosine decay to lr/10) with one "
          f"block's FP4 forward error ({rounding}) amplified "
          f"{args.amplify:g}x in the training steps only (the evaluation exact), AdamW fed "
          f"as each route says; gap: final validation loss ({args.eval_batches} batches) minus that of route exact "
          f"(the same loop without the error), paired per seed {args.seeds}; share: of route both's mean gap.", "",
          "| checkpoint | block | route | gap per seed | mean +- SE | share of both |", "|---|---|---|---|---|---|"]
    md += [f"| {r['phase']} | {r['block']} | {r['route']} | " + ", ".join(f"{g:+.4f}" for g in r["gaps"])
           + f" | {r['mean_gap']:+.4f} +- {r['standard_error']:.4f} | {r['share_of_both']:.2f} |" for r in routes]
    md += ["", "Forward error energy, rounded stochastically over rounded to nearest (the calibration batch, per layer): "
           + "; ".join(f"checkpoint {phase}: median {statistics.median(r.values()):.2f}, {min(r.values()):.2f}-"
                       f"{max(r.values()):.2f} over {len(r)} layers" for phase, r in energy.items()) + "."]
    if not prices:
        return "\n".join(md)
    md += ["", f"Prices ({args.price_batches} calibration batches, the error not amplified): the block's LD, the drift "
           "price of its gradient change (whole and odd part), the scale study's --blocks truths per unit k^2 (fprop_train: "
           "the error in training only; fprop: in evaluation too) and LD 100 steps on (LD later, foresight) as the end "
           "value plus the rise, LD later + max(0, LD later - LD); ratios of the truths to the prices.", "",
           "| checkpoint | block | truth_train | truth | LD | drift whole | drift odd | LD later | end + rise | "
           "truth_train / LD | truth_train / drift whole | truth_train / drift odd | truth / LD | "
           "truth / (end + rise) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['phase']} | {r['block']} | {num(r['truth_train'])} | {num(r['truth'])} | {num(r['ld'])} | "
           f"{num(r['drift_whole'])} | {num(r['drift_odd'])} | {num(r['ld_later'])} | {num(r['end_and_growth'])} | "
           f"{ratio(r['truth_train'], r['ld'])} | {ratio(r['truth_train'], r['drift_whole'])} | "
           f"{ratio(r['truth_train'], r['drift_odd'])} | {ratio(r['truth'], r['ld'])} | "
           f"{ratio(r['truth'], r['end_and_growth'])} |" for r in prices]
    return "\n".join(md)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--phases", type=ints, default=[100], help="bf16 checkpoint steps (default: %(default)s)")
    p.add_argument("--blocks", type=ints, default=[0, 2], help="transformer blocks (default: %(default)s)")
    p.add_argument("--seeds", type=ints, default=[0, 1, 2, 3], help="routes: paired seeds (default: %(default)s)")
    p.add_argument("--steps", type=int, default=100, help="branch length (default: %(default)s)")
    p.add_argument("--amplify", type=float, default=3.0, help="routes: the error's factor (default: %(default)s)")
    p.add_argument("--eval-batches", type=int, default=16, help="validation batches (default: %(default)s)")
    p.add_argument("--routes", type=lambda s: s.split(","), default=list(ROUTES),
                   help="routes: which (default: all; exact and both are always run)")
    p.add_argument("--rounding", choices=ROUNDINGS, default="rne", help="routes: the forward operands' rounding")
    p.add_argument("--price-phases", type=ints, default=None,
                   help="prices: checkpoints (default: --phases; empty: none); a minute each, the routes hours")
    p.add_argument("--price-batches", type=int, default=8, help="prices: batches (default: %(default)s)")
    p.add_argument("--workers", type=int, default=1, help="routes: worker processes, one thread each")
    p.add_argument("--name", default="forward-train", help="results file stem cpu-planner-<name>")
    add_run_arguments(p)
    args = p.parse_args()
    if args.price_batches < 2:
        p.error("--price-batches must be >= 2 (the squared mean without its noise needs two)")
    if unknown := set(args.routes) - set(ROUTES):
        p.error(f"unknown routes {sorted(unknown)}; known: {', '.join(ROUTES)}")
    args.routes = [r for r in ROUTES if r in {"exact", "both", *args.routes}]
    torch.set_num_threads(args.threads)
    routes = route_rows(args)
    energy = {phase: sr_energy_ratios(phase) for phase in args.phases}
    args.price_phases = args.phases if args.price_phases is None else args.price_phases
    prices = price_rows(argparse.Namespace(**{**vars(args), "phases": args.price_phases}))
    results.write(args.results, args.name, {
        "steps": args.steps, "amplify": args.amplify, "rounding": args.rounding, "seeds": args.seeds,
        "blocks": args.blocks, "price_phases": args.price_phases, "price_batches": args.price_batches,
        "routes": routes, "sr_over_rne_error_energy": energy, "prices": prices}, markdown(args, routes, prices, energy))


if __name__ == "__main__":
    main()
