"""`SnipPlanner`: measure -> solve -> install, every `interval` steps of a training loop.

    planner = SnipPlanner(model, optimizer, PlannerConfig(budget=Budget.fp4_fraction(0.75), interval=100))
    for step, batch in enumerate(loader):
        planner.step(step, batch)          # re-plans at the first step s, s + 100, s + 200, ... before the step
        loss = model.loss(batch); loss.backward(); optimizer.step(); optimizer.zero_grad()

Between re-plans the planner does nothing: the installed precisions stay on the SnipLinear modules.
Under torch.distributed every rank measures on its own batch, the per-layer statistics are averaged
with one all-reduce, rank 0 solves the ILP and broadcasts the plan as JSON, and every rank installs
that same plan. Pass the bare module, not the DDP wrapper (a DDP-wrapped model is unwrapped): the
measurement passes must not trigger DDP's gradient synchronisation.

Tensor parallelism (`tp_group`, with `dp_group` for TP x DP): the ranks of a TP group see one batch and
one model whose layers are sharded (DTensor parameters, torch's parallel styles). The statistics are
measured on the whole layers, gathered: for the measurement every DTensor parameter (and Adam moment)
of the model is replaced in place by its whole tensor and the parallel styles' hooks are set aside, so
what each TP rank measures is what one process holding the whole model measures; afterwards the
shards and hooks are put back. The TP group's first rank's statistics are then broadcast over the TP
group (the ranks measured the same thing: this only makes them agree bit for bit), the DP replicas'
statistics are averaged over `dp_group`, and rank 0 of the world solves and broadcasts the plan. The
cost is the whole weights and Adam moments on every rank while it measures. Under FSDP2 (with or
without TP) the FSDP modules are unsharded for the measurement first (planner/fsdp.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch
import torch.distributed as dist
from torch import nn

from snip_ops import SnipLinear, convert
from snip_ops.module import DEFAULT_EXCLUDE
from snip_ops.reference import divide_by

from .baselines import BASELINES, baseline, baseline_objective
from .cost import Budget
from .divergence import DivergenceConfig, LogitsFn, PlannedModel, lm_logits, measure
from .fsdp import OptimizerView, is_dtensor, is_fsdp_module, unsharded_for_planning
from .ilp import (DEFAULT_LAMBDA, OBJECTIVE_TERMS, Constraints, assignment_objective, snip_objective, solve,
                  validate_candidates)
from .plan import Plan
from .schedule import PrecisionSchedule, ScheduleState
from .stats import LossFn, PlannerStats, StatsConfig, batch_rows, first_rows

__all__ = ["PlannerConfig", "SnipPlanner", "default_loss_fn"]


@dataclass(frozen=True)
class PlannerConfig:
    candidates: tuple[str, ...] = ("fp8", "fp4")
    budget: Budget = field(default_factory=lambda: Budget.fp4_fraction(0.75))
    interval: int = 100                       # re-plan every `interval` steps (and at the first step)
    lam: float = DEFAULT_LAMBDA               # weight of WD against LD (see ilp.DEFAULT_LAMBDA)
    terms: str = "ld+wd"                      # SNIP's objective, or one of its terms alone (ilp.OBJECTIVE_TERMS)
    schedule: PrecisionSchedule | None = None  # re-plans on triggers and a raised budget (planner.schedule)
    granularity: str = "gemm"                 # "gemm" (fprop, dgrad, wgrad apart) or "layer" (one per layer)
    wd_horizon: int | str = "interval"        # WD's horizon: "interval", a number of steps or "settled"
    method: str = "snip"                      # "snip" (the ILP) or a baseline name (baselines.BASELINES)
    baseline_seed: int = 0                    # the "random" baseline's draw of layer priorities
    pinned: Mapping[str, object] = field(default_factory=dict)  # {FQN or pattern: precision}
    stages: Mapping[str, int] | None = None   # {FQN or pattern: pipeline stage}: budget per stage
    calib_batch_size: int | None = None       # measure on the first rows of the batch only
    tokens_per_step: int | None = None        # M for measured GEMM costs (default: the calibration batch's)
    stats: StatsConfig = field(default_factory=StatsConfig)
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)

    def __post_init__(self):
        object.__setattr__(self, "candidates", validate_candidates(tuple(self.candidates)))
        if self.interval < 1:
            raise ValueError(f"interval must be >= 1, got {self.interval}")
        if self.granularity not in ("layer", "gemm"):
            raise ValueError(f"granularity must be 'layer' or 'gemm', got {self.granularity!r}")
        if self.method != "snip" and self.method not in BASELINES and not self.method.startswith("uniform_"):
            raise ValueError(f"method must be 'snip' or a baseline ({', '.join(BASELINES)}), got {self.method!r}")
        if self.terms not in OBJECTIVE_TERMS:
            raise ValueError(f"terms must be one of {OBJECTIVE_TERMS}, got {self.terms!r}")
        steps = isinstance(self.wd_horizon, int) and not isinstance(self.wd_horizon, bool) and self.wd_horizon >= 1
        if not steps and self.wd_horizon not in ("interval", "settled"):
            raise ValueError(f"wd_horizon must be 'interval', 'settled' or a number of steps >= 1, "
                             f"got {self.wd_horizon!r}")
        if self.schedule is not None and self.schedule.drift is not None and self.schedule.min_interval > self.interval:
            raise ValueError(f"the schedule's min_interval ({self.schedule.min_interval}) exceeds interval "
                             f"({self.interval})")
        if self.divergence.wd_horizon is not None:
            raise ValueError("set the horizon as PlannerConfig.wd_horizon, not DivergenceConfig.wd_horizon")

    @property
    def divergence_config(self) -> DivergenceConfig:
        """`divergence` with the horizon resolved: a plan lives `interval` steps, so by default WD prices the
        excess loss its gradient noise causes within them (divergence.py, "wd_horizon")."""
        if self.wd_horizon == "settled":
            return self.divergence
        horizon = self.interval if self.wd_horizon == "interval" else self.wd_horizon
        return dataclasses.replace(self.divergence, wd_horizon=horizon)


def default_loss_fn(model: nn.Module, batch) -> torch.Tensor:
    if not hasattr(model, "loss"):
        raise TypeError(f"{type(model).__name__} has no .loss(batch); pass loss_fn=(model, batch) -> scalar loss")
    return model.loss(batch)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class SnipPlanner:
    """Periodic precision planning for the linear layers of `model` (see the module docstring)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, config: PlannerConfig | None = None,
                 *, loss_fn: LossFn | None = None, logits_fn: LogitsFn | None = None,
                 filter_fn: Callable[[nn.Module, str], bool] | None = None,
                 log: Callable[[str], None] | None = None, tp_group: dist.ProcessGroup | None = None,
                 dp_group: dist.ProcessGroup | None = None, lr_schedule: Callable[[int], float] | None = None,
                 **overrides):
        config = config or PlannerConfig()
        self.config = dataclasses.replace(config, **overrides) if overrides else config
        self.model = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
        self.optimizer = optimizer
        self.loss_fn = loss_fn or default_loss_fn
        self.logits_fn = logits_fn
        # step -> learning rate (any scale: WD's horizon reads its ratios to the re-plan step's), e.g. the
        # training loop's schedule or a LambdaLR's lr_lambda; None: the learning rate stays where it is
        self.lr_schedule = lr_schedule
        self.log = log or (lambda msg: None)
        # Without tp_group every rank is a data-parallel replica (dp_group None: the whole world); with it,
        # dp_group None means one replica (no data parallelism).
        if dp_group is not None and tp_group is None:
            raise ValueError("dp_group is for tensor parallelism x data parallelism: pass tp_group too "
                             "(without tensor parallelism every rank is a data-parallel replica)")
        self.tp_group, self.dp_group = tp_group, dp_group
        keep = filter_fn or (lambda mod, name: not any(fnmatch.fnmatchcase(name, p) for p in DEFAULT_EXCLUDE))
        # Plain nn.Linear layers become SnipLinear (bf16 until the first plan); converted ones keep theirs.
        convert(self.model, None, lambda mod, name: keep(mod, name) and not isinstance(mod, SnipLinear))
        self.layers = {n: m for n, m in self.model.named_modules() if isinstance(m, SnipLinear) and keep(m, n)}
        if not self.layers:
            raise ValueError("the model has no linear layer to plan")
        self.plan: Plan | None = None
        self.history: list[dict] = []  # one summary per re-plan: step, why, metrics, timings
        self.schedule_state = ScheduleState()
        self.start_step: int | None = None  # the step of the first plan: re-plans are `interval` steps apart from it

    # -- the training-loop interface -------------------------------------------------------
    def due(self, step: int) -> bool:
        """No plan yet, or `interval` steps (a multiple) after the first plan's step; with the schedule's
        drift, the step it set after the last re-plan (planner.schedule)."""
        if self.plan is None or self.start_step is None:
            return True
        if self._drift is not None and self.schedule_state.next_step is not None:
            return step >= self.schedule_state.next_step
        return (step - self.start_step) % self.config.interval == 0

    @property
    def _drift(self) -> float | None:
        return self.config.schedule.drift if self.config.schedule is not None else None

    def step(self, step: int, batch, loss_fn: LossFn | None = None) -> Plan | None:
        """Call once per optimizer step, before it (after the loop set this step's learning rate): re-plans
        (and returns the new plan) when due or triggered (PlannerConfig.schedule), else None."""
        reasons = self._triggers(step)
        return self.replan(batch, step, loss_fn, reasons) if reasons else None

    def observe_loss(self, loss: float) -> None:
        """Report a training step's loss to the schedule's spike trigger (a no-op without one). Under
        torch.distributed pass the same value on every rank (e.g. the all-reduced mean)."""
        if self.config.schedule is not None:
            self.schedule_state.observe_loss(self.config.schedule, float(loss))

    def _triggers(self, step: int) -> list[str]:
        reasons = ["interval"] if self.due(step) else []
        sched, state = self.config.schedule, self.schedule_state
        if sched is None:
            return reasons
        if self.optimizer is not None and state.observe_lr(sched, float(self.optimizer.param_groups[0]["lr"])):
            reasons.append("lr_decay")
        if state.spike_pending:
            state.spike_pending = False
            reasons.append("loss_spike")
        if _distributed():  # one rank's spike re-plans on every rank: the measurement is collective
            flag = torch.tensor([float(bool(reasons))], device=_collective_device())
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item() and not reasons:
                reasons.append("loss_spike")
        return reasons

    def as_hook(self) -> Callable[[int, nn.Module, object], Plan | None]:
        """An `on_step(step, model, batch)` callback for snip_train.train."""
        return lambda step, model, batch: self.step(step, batch)

    def replan(self, batch, step: int | None = None, loss_fn: LossFn | None = None,
               reasons: list[str] | None = None) -> Plan:
        t0 = time.perf_counter()
        stats = self.measure(batch, step, loss_fn)
        t1 = time.perf_counter()
        plan, noisy, regret = self._solve_everywhere(stats)
        self.schedule_state.noisy = self.schedule_state.noisy or noisy
        if self.start_step is None and step is not None:
            self.start_step = step
        if self._drift is not None and step is not None:
            self.schedule_state.space_replans(self.config.schedule, self.config.interval, step, regret)
        self.install(plan)
        t2 = time.perf_counter()
        drift = {} if regret is None else {"regret": regret, "next_step": self.schedule_state.next_step}
        share = {"wgrad_signal_share": stats.diagnostics["wgrad_signal_share"]} \
            if "wgrad_signal_share" in stats.diagnostics else {}
        self.history.append({"step": step, "why": list(reasons or ["requested"]), "measure_s": t1 - t0,
                             "solve_s": t2 - t1, "budget": plan.budget, **dict(plan.metrics), **share, **drift})
        self.log(f"planner: step {step}: {plan.method} plan, FP4 FLOPs {100 * plan.metrics['fp4_fraction']:.1f}%, "
                 f"cost {plan.metrics['relative_cost']:.3f} x bf16, measured in {t1 - t0:.1f}s, "
                 f"solved in {t2 - t1:.2f}s")
        return plan

    # -- the pieces --------------------------------------------------------------------------
    def measure(self, batch, step: int | None = None, loss_fn: LossFn | None = None) -> PlannerStats:
        """Statistics and divergences on `batch` (averaged over ranks under torch.distributed)."""
        n = self.config.calib_batch_size
        if n is not None:
            batch = first_rows(batch, n)
        sched = self.config.schedule
        noise = sched is not None and sched.noise_ratio is not None and (batch_rows(batch) or 0) >= 2
        ratios = self._lr_ratios(step)
        with contextlib.ExitStack() as stack:
            optimizer = stack.enter_context(unsharded_for_planning(self.model, self.optimizer))  # no-op without FSDP2
            if self.tp_group is not None:
                optimizer = stack.enter_context(_whole_tensor_parallel_layers(self.model, optimizer))
            planned = PlannedModel(self.model, self.layers, optimizer, loss_fn or self.loss_fn,
                                   self._logits_fn(batch, loss_fn))
            stats = measure(planned, batch, self.config.candidates, self.config.stats, self.config.divergence_config,
                            step, gradient_noise=noise, lr_ratios=ratios)
        if not _distributed():
            return stats
        if self.tp_group is None:
            return _reduce_stats(stats, dist.ReduceOp.SUM, None)
        stats = _reduce_stats(stats, None, self.tp_group)
        return _reduce_stats(stats, dist.ReduceOp.SUM, self.dp_group) if self.dp_group else stats

    def _lr_ratios(self, step: int | None) -> list[float] | None:
        """The learning rate of each step of WD's horizon from `step` on, relative to `step`'s (None without a
        schedule, a step or a horizon: WD prices the horizon at the current learning rate; None too where that
        rate is 0, as at the last step of a decay to 0: the optimizer's learning rate prices WD at 0 then)."""
        horizon = self.config.divergence_config.wd_horizon
        if self.lr_schedule is None or step is None or horizon is None:
            return None
        rates = [self._scheduled_lr(step + t) for t in range(horizon)]
        return [r / rates[0] for r in rates] if rates[0] > 0 else None

    def _scheduled_lr(self, step: int) -> float:
        rate = float(self.lr_schedule(step))
        if not (math.isfinite(rate) and rate >= 0):
            raise ValueError(f"lr_schedule gave {rate} at step {step}: learning rates must be finite and >= 0")
        return rate

    def _logits_fn(self, batch, loss_fn: LossFn | None) -> LogitsFn | None:
        """The given logits_fn; else, for the default loss of a causal LM on a window batch [B, T+1] (the
        convention of `model.loss`), `lm_logits`; else None (no Fisher curvature)."""
        if self.logits_fn is not None:
            return self.logits_fn
        lm_window = torch.is_tensor(batch) and batch.dim() == 2 and not batch.is_floating_point()
        if loss_fn is None and self.loss_fn is default_loss_fn and lm_window:
            return lm_logits
        return None

    def solve(self, stats: PlannerStats, budget: Budget | None = None) -> Plan:
        """The configured method's plan at `budget` (default: the schedule's current budget)."""
        c = self.config
        budget = budget or self.schedule_state.budget(c.schedule, c.budget)
        if c.method == "snip":
            return solve(stats, budget, c.candidates, lam=c.lam, granularity=c.granularity, terms=c.terms,
                         constraints=Constraints(pinned=c.pinned, stages=c.stages, tokens=c.tokens_per_step))
        high, low = c.candidates[0], c.candidates[-1]  # e.g. ("fp8", "fp4")
        return baseline(c.method, stats, budget, high, low, lam=c.lam, granularity=c.granularity,
                        tokens=c.tokens_per_step, seed=c.baseline_seed)

    def objective(self, plan: Plan, stats: PlannerStats) -> float:
        """The configured method's own objective of `plan` under `stats`: what its ILP minimises (SNIP's
        LD/L + lambda WD/L, a heuristic's score; 0 for a uniform plan, which has no choice to regret)."""
        c = self.config
        if c.method.startswith("uniform_"):
            return 0.0
        term = (snip_objective(stats, c.lam, c.terms) if c.method == "snip" else
                baseline_objective(c.method, stats, c.candidates[-1], seed=c.baseline_seed, granularity=c.granularity))
        return assignment_objective(plan.assignment(), stats, term)

    def regret(self, old: Plan, new: Plan, stats: PlannerStats) -> float:
        """How much worse the previous plan is than the new one under the new statistics: F(old) / F(new) - 1
        (F: `objective`), 0 when neither costs anything, inf when only the old one does."""
        f_old, f_new = self.objective(old, stats), self.objective(new, stats)
        if not f_new > 0:
            return 0.0 if not f_old > f_new else math.inf
        return max(0.0, f_old / f_new - 1.0)

    def _solve_with_schedule(self, stats: PlannerStats) -> tuple[Plan, bool, float | None]:
        """The plan; whether the noise-ratio trigger fired on it (then it is made at the raised budget); with
        the schedule's drift, the previous plan's regret under `stats` (None at the first plan)."""
        plan, noisy = self.solve(stats), False
        sched = self.config.schedule
        if sched is not None and sched.noise_ratio is not None and not self.schedule_state.noisy:
            quantization = plan.metrics.get("wd", 0.0) * stats.loss  # sum of WD (loss units) of the plan's GEMMs
            noise = stats.diagnostics.get("gradient_noise_loss")
            if (noise is not None and quantization > 0
                    and noise / quantization < sched.noise_ratio):
                plan, noisy = self.solve(stats, sched.raised_budget), True
        regret = None if self._drift is None or self.plan is None else self.regret(self.plan, plan, stats)
        return plan, noisy, regret

    def _solve_everywhere(self, stats: PlannerStats) -> tuple[Plan, bool, float | None]:
        if not _distributed():
            return self._solve_with_schedule(stats)
        box: list = [None]
        if dist.get_rank() == 0:
            try:
                plan, noisy, regret = self._solve_with_schedule(stats)
                box[0] = {"plan": plan.to_json(), "noisy": noisy, "regret": regret}
            except Exception as e:  # every rank must leave the broadcast, so errors travel too
                box[0] = {"error": f"{type(e).__name__}: {e}"}
        dist.broadcast_object_list(box, src=0)
        if "error" in box[0]:
            raise RuntimeError(f"planning failed on rank 0: {box[0]['error']}")
        return Plan.from_json(box[0]["plan"]), box[0]["noisy"], box[0]["regret"]

    def install(self, plan: Plan) -> None:
        plan.apply(self.model)
        self.plan = plan

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"plan": self.plan.to_json() if self.plan is not None else None, "history": list(self.history),
                "schedule": self.schedule_state.to_json(), "start_step": self.start_step}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore the plan of a checkpoint; the resumed run keeps it until the next re-plan step."""
        self.history = list(state.get("history", []))
        self.schedule_state = ScheduleState.from_json(state.get("schedule", {}))
        self.start_step = state.get("start_step", 0 if state.get("plan") is not None else None)
        if state.get("plan") is not None:
            self.install(Plan.from_json(state["plan"]))

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w") as f:
            json.dump(self.state_dict(), f)

    def load(self, path: str | os.PathLike) -> None:
        with open(path) as f:
            self.load_state_dict(json.load(f))


def _collective_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _reduce_stats(stats: PlannerStats, op: dist.ReduceOp | None, group: dist.ProcessGroup | None) -> PlannerStats:
    """Every per-layer number reduced over `group` (None: the world) in one collective of one flat float64
    tensor: averaged (op SUM, then divided by the group's size), or with op None broadcast from the
    group's first rank."""
    t = torch.tensor(stats.to_vector(), dtype=torch.float64, device=_collective_device())
    if op is None:
        dist.broadcast(t, src=dist.get_global_rank(group, 0), group=group)
        return stats.with_vector(t.tolist())
    dist.all_reduce(t, op=op, group=group)
    return stats.with_vector(divide_by(t, dist.get_world_size(group)).tolist())


# nn.Module's forward-hook registries: set aside together, so that hooks taking kwargs stay marked so.
_HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
               "_forward_hooks_always_called")


@contextlib.contextmanager
def _whole_tensor_parallel_layers(model: nn.Module, optimizer: torch.optim.Optimizer | None):
    """Within: `model` with every DTensor parameter replaced by its whole tensor, and the forward hooks of
    the parallel styles (torch's distribute_module: they redistribute DTensors) and of FSDP2's modules set
    aside; yields an optimizer view whose Adam state is gathered whole for those tensors. In place (an
    FSDP2 module cannot be copied); on exit every parameter and hook is put back. Collective: every rank
    of the parameters' meshes enters it, in the same order."""
    swapped, hooks, new_params = [], [], {}
    try:
        with torch.no_grad():
            for mod in model.modules():
                for name, p in list(mod.named_parameters(recurse=False)):
                    if is_dtensor(p):
                        new_params[p] = nn.Parameter(p.full_tensor().detach(), requires_grad=p.requires_grad)
                        swapped.append((mod, name, p))
                        mod._parameters[name] = new_params[p]
                if getattr(mod, "_distribute_module_applied", False) or is_fsdp_module(mod):
                    hooks.append((mod, {d: dict(getattr(mod, d)) for d in _HOOK_DICTS}))
                    for d in _HOOK_DICTS:
                        getattr(mod, d).clear()
        if optimizer is None:
            yield None
            return
        yield OptimizerView(optimizer, new_params)
    finally:
        for mod, name, p in swapped:
            mod._parameters[name] = p
        for mod, saved in hooks:
            for d, entries in saved.items():
                getattr(mod, d).update(entries)
