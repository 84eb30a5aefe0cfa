"""Pictures of plans and runs (matplotlib Agg canvas: no display, no global backend switch).

* `plot_plan_heatmap`: layer x GEMM -> format, next to each layer's LD/L and lambda*WD for the
  lowest-precision candidate (why the ILP kept or lowered it).
* `plot_loss_comparison`: validation (and smoothed training) loss of several runs on one axis.
"""

from __future__ import annotations

import math
import os
from typing import Mapping, Sequence

from snip_ops.formats import GEMMS

from .plan import Plan

__all__ = ["plot_plan_heatmap", "plot_loss_comparison", "FORMAT_ORDER"]

# High to low precision; colours go from light (bf16) to dark red (4-bit).
FORMAT_ORDER = ("bf16", "fp8", "fp8_e5m2grad", "mxfp8", "nvfp4", "mxfp4", "fp4")
_COLORS = ("#f0f0f0", "#9ecae1", "#6baed6", "#4292c6", "#fc9272", "#fb6a4a", "#cb181d")


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def plot_plan_heatmap(plan: Plan, path: str | os.PathLike, title: str | None = None) -> None:
    from matplotlib.colors import ListedColormap

    names = list(plan.precisions)
    codes = [[FORMAT_ORDER.index(plan.precisions[n].gemm(g).name) for g in GEMMS] for n in names]
    fig = _figure(9.0, 1.2 + 0.24 * len(names))
    ax = fig.add_axes([0.30, 0.08, 0.25, 0.84])
    ax.imshow(codes, cmap=ListedColormap(_COLORS), vmin=-0.5, vmax=len(FORMAT_ORDER) - 0.5, aspect="auto")
    for i, row in enumerate(codes):
        for j, c in enumerate(row):
            ax.text(j, i, FORMAT_ORDER[c], ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(GEMMS)), GEMMS, fontsize=8)
    ax.xaxis.tick_top()
    ax.set_yticks(range(len(names)), names, fontsize=7)
    stats = plan.stats.by_name() if plan.stats is not None else {}
    low = next((c for c in reversed(FORMAT_ORDER) if c in plan.candidates), None)
    if stats and low is not None and low in plan.stats.candidates():
        lam = plan.lam if plan.lam is not None else 1.0
        bx = fig.add_axes([0.60, 0.08, 0.37, 0.84], sharey=ax)
        ld = [stats[n].ld(low) / plan.stats.loss for n in names]
        wd = [lam * stats[n].wd(low) for n in names]
        y = list(range(len(names)))
        bx.barh([v - 0.2 for v in y], ld, height=0.4, color="tab:blue", label=f"LD/L ({low})")
        bx.barh([v + 0.2 for v in y], wd, height=0.4, color="tab:orange", label=f"lambda*WD ({low})")
        if any(v > 0 for v in ld + wd):
            bx.set_xscale("log")
        bx.tick_params(labelleft=False, labelsize=7)
        bx.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
        bx.grid(alpha=0.3, axis="x")
    m = plan.metrics
    at = f", step {plan.step}" if plan.step is not None else ""
    fig.suptitle(title or f"{plan.method} plan{at}: FP4 FLOPs {100 * m.get('fp4_fraction', 0):.1f}%, "
                 f"cost {m.get('relative_cost', 0):.3f} x bf16", fontsize=9, y=0.995)
    fig.savefig(os.fspath(path))


def plot_loss_comparison(path: str | os.PathLike, runs: Mapping[str, Mapping], title: str | None = None,
                         smooth: float = 0.1) -> None:
    """`runs`: {label: snip_train summary dict (its "history")}; draws val loss and the train-loss EMA."""
    fig = _figure(7.5, 4.4)
    ax = fig.add_subplot(1, 1, 1)
    finite: list[float] = []
    for i, (label, summary) in enumerate(runs.items()):
        color = f"C{i}"
        hist = summary["history"]
        steps, loss = hist["train"]["step"], hist["train"]["loss"]
        ax.plot(steps, _ema(loss, smooth), color=color, lw=1.2, alpha=0.6)
        vs, vl = hist["val"]["step"], hist["val"]["loss"]
        ax.plot(vs, vl, "o-", color=color, lw=1.6, ms=3, label=f"{label} (val {vl[-1]:.3f})" if vl else label)
        finite += [v for v in list(loss) + list(vl) if v is not None and math.isfinite(v)]
    if finite:
        lo = min(finite)
        ax.set_ylim(max(0.0, lo - 0.1), min(max(finite), lo + 2.5) + 0.1)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token); line: train EMA, dots: validation")
    if title:
        ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.fspath(path))


def _ema(values: Sequence[float], alpha: float) -> list[float]:
    out, m, w = [], 0.0, 0.0
    for v in values:
        if v is not None and math.isfinite(v):
            m, w = (1 - alpha) * m + alpha * v, (1 - alpha) * w + alpha
        out.append(m / w if w else float("nan"))
    return out
