"""A precision plan: layer FQN -> LinearPrecision, with how it was made, as plain JSON (docs/design.md §4.6).

JSON layout (`Plan.to_json`):

    {"format": "snip-plan/1",
     "plan": {"model.layers.0.self_attn.q_proj": "fp4",
              "model.layers.0.mlp.down_proj": {"fprop": "fp8", "dgrad": "fp4", "wgrad": "fp8"}, ...},
     "method": "snip", "step": 100, "granularity": "layer", "candidates": ["fp8", "fp4"], "lambda": 1.0,
     "budget": {"kind": "fp4_fraction", "value": 0.75, "cost_model": "theoretical"},
     "metrics": {"fp4_fraction": 0.75, "relative_cost": 0.31, "objective": ..., ...},
     "stats": {... PlannerStats.to_json() ...}}

The "plan" object is exactly what `snip_ops.convert(model, plan=...)` and `snip train --precision
plan.json` accept.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Mapping

from torch import nn

from snip_ops import LinearPrecision, SnipLinear
from snip_ops.formats import GEMMS

from .stats import PlannerStats

__all__ = ["Plan", "PLAN_FORMAT"]

PLAN_FORMAT = "snip-plan/1"


@dataclass(frozen=True)
class Plan:
    precisions: Mapping[str, LinearPrecision]
    method: str = "snip"
    step: int | None = None
    granularity: str = "layer"
    candidates: tuple[str, ...] = ()
    lam: float | None = None
    budget: Mapping | None = None          # Budget.to_json() of the budget it was made for
    metrics: Mapping[str, float] = field(default_factory=dict)
    stats: PlannerStats | None = None

    def __post_init__(self):
        object.__setattr__(self, "precisions", {n: LinearPrecision.of(p) for n, p in self.precisions.items()})

    def assignment(self) -> dict[tuple[str, str], str]:
        """{(layer, GEMM): recipe name}."""
        return {(n, g): p.gemm(g).name for n, p in self.precisions.items() for g in GEMMS}

    # -- install -------------------------------------------------------------------------
    def apply(self, model: nn.Module) -> None:
        """Set every planned layer of `model` (SnipLinear modules, matched by FQN) to its precision."""
        modules = dict(model.named_modules())
        missing = [n for n in self.precisions if not isinstance(modules.get(n), SnipLinear)]
        if missing:
            raise ValueError(f"plan layers {missing[:5]} are not SnipLinear modules of this model "
                             "(convert it with snip_ops.convert first)")
        for name, precision in self.precisions.items():
            modules[name].set_precision(precision)

    # -- JSON ------------------------------------------------------------------------------
    def to_json(self, with_stats: bool = True) -> dict:
        out = {
            "format": PLAN_FORMAT,
            "plan": {n: p.to_json() for n, p in self.precisions.items()},
            "method": self.method, "step": self.step, "granularity": self.granularity,
            "candidates": list(self.candidates), "lambda": self.lam, "budget": self.budget,
            "metrics": dict(self.metrics),
        }
        if with_stats and self.stats is not None:
            out["stats"] = self.stats.to_json()
        return out

    @classmethod
    def from_json(cls, obj: Mapping) -> "Plan":
        if obj.get("format") != PLAN_FORMAT or not isinstance(obj.get("plan"), Mapping):
            raise ValueError(f"not a {PLAN_FORMAT} plan: expected an object with 'format': '{PLAN_FORMAT}' and a "
                             "'plan' mapping")
        stats = obj.get("stats")
        return cls(
            precisions={n: LinearPrecision.from_json(p) for n, p in obj["plan"].items()},
            method=obj.get("method", "snip"), step=obj.get("step"), granularity=obj.get("granularity", "layer"),
            candidates=tuple(obj.get("candidates", ())), lam=obj.get("lambda"), budget=obj.get("budget"),
            metrics=dict(obj.get("metrics", {})),
            stats=PlannerStats.from_json(stats) if stats is not None else None)

    def save(self, path: str | os.PathLike, with_stats: bool = True) -> None:
        with open(path, "w") as f:
            json.dump(self.to_json(with_stats), f, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Plan":
        with open(path) as f:
            return cls.from_json(json.load(f))

    # -- display ---------------------------------------------------------------------------
    def table(self) -> str:
        """Layer x GEMM -> format, with the chosen formats' LD/L and WD/L when statistics are attached."""
        by_name = self.stats.by_name() if self.stats is not None else {}
        loss = self.stats.loss if self.stats is not None else None
        width = max([len(n) for n in self.precisions] + [5])
        head = f"{'layer':<{width}}  {'fprop':>6} {'dgrad':>6} {'wgrad':>6}"
        if by_name:
            head += f"  {'LD/L':>9} {'WD/L':>9}"
        lines = [head, "-" * len(head)]
        for name, p in self.precisions.items():
            row = f"{name:<{width}}  {p.fprop.name:>6} {p.dgrad.name:>6} {p.wgrad.name:>6}"
            s = by_name.get(name)
            if s is not None:
                try:
                    ld = s.ld(p.fprop.name) / loss if not p.fprop.is_bf16 else 0.0
                    wd = sum(s.wd(p.gemm(g).name, g) for g in ("dgrad", "wgrad") if not p.gemm(g).is_bf16) / loss
                    row += f"  {ld:9.2e} {wd:9.2e}"
                except KeyError:  # a precision whose errors were not measured (e.g. a pinned one)
                    row += f"  {'-':>9} {'-':>9}"
            lines.append(row)
        m = self.metrics
        if m:
            lines.append("-" * len(head))
            parts = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in m.items()]
            lines.append(f"{self.method}: " + ", ".join(parts))
        return "\n".join(lines)
