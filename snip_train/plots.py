"""Every picture snip draws: PNGs on a matplotlib Agg canvas (no display, no global backend switch).

* `plot_losses`: one run's training (raw and smoothed) and validation loss;
* `plot_branch_gaps`: the paired comparison's validation-loss gap of each method to the bf16 branch over
  the branch steps, mean and range over seeds;
* `plot_plan_heatmap`: a plan's layer x GEMM -> format, next to each layer's LD/L and lambda*WD for the
  lowest-precision candidate (why the ILP kept or lowered it);
* `plot_sweep_heatmaps`: a stability sweep's precision x learning rate, the divergence rate over seeds
  (annotated k/n) and the mean final held-out loss of the runs that did not diverge;
* `plot_sweep_sharpness`: early sharpness against final loss per sweep cell, diverged cells marked, one
  panel per direction kind.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

from snip_ops.formats import GEMMS

__all__ = ["ema", "plot_losses", "plot_branch_gaps", "plot_plan_heatmap", "plot_sweep_heatmaps",
           "plot_sweep_sharpness", "FORMAT_ORDER"]

# High to low precision; colours go from light (bf16) to dark red (4-bit).
FORMAT_ORDER = ("bf16", "fp8", "fp8_e5m2grad", "mxfp8", "nvfp4", "nvfp4_train", "mxfp4", "fp4")
_COLORS = ("#f0f0f0", "#9ecae1", "#6baed6", "#4292c6", "#fc9272", "#fc7a5f", "#fb6a4a", "#cb181d")


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _save_loss_axes(fig, ax, ylabel: str, title: str | None, title_size: int, path: str | os.PathLike) -> None:
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=title_size)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.fspath(path))


def ema(values: Sequence[float | None], alpha: float = 0.1) -> list[float]:
    """Bias-corrected exponential moving average (None and non-finite values are skipped)."""
    out, m, w = [], 0.0, 0.0
    for v in values:
        if v is not None and math.isfinite(v):
            m = (1 - alpha) * m + alpha * v
            w = (1 - alpha) * w + alpha
        out.append(m / w if w > 0 else float("nan"))
    return out


def plot_losses(path: str | os.PathLike, train_steps: Sequence[int], train_loss: Sequence[float],
                val_steps: Sequence[int] = (), val_loss: Sequence[float] = (),
                title: str | None = None, curves: dict[str, tuple[Sequence[int], Sequence[float]]] | None = None,
                ) -> None:
    """Train (raw + smoothed) and validation loss curves, saved as a PNG at ``path``.

    ``curves`` optionally adds more named (steps, values) lines, e.g. other runs to compare.
    """
    fig = _figure(7, 4.2)
    ax = fig.add_subplot(1, 1, 1)
    if len(train_steps):
        ax.plot(train_steps, train_loss, color="tab:blue", alpha=0.25, lw=0.8)
        alpha = min(0.3, max(0.05, 10.0 / len(train_loss)))
        ax.plot(train_steps, ema(train_loss, alpha), color="tab:blue", lw=1.6, label="train (EMA)")
    if len(val_steps):
        ax.plot(val_steps, val_loss, "o-", color="tab:orange", lw=1.6, ms=3.5, label="validation")
    for name, (xs, ys) in (curves or {}).items():
        ax.plot(xs, ys, lw=1.4, label=name)
    ax.axhline(math.log(256), color="gray", ls=":", lw=0.8, label="ln 256 (uniform bytes)")
    finite = [v for v in list(train_loss) + list(val_loss) if math.isfinite(v)]
    if finite:
        ax.set_ylim(max(0.0, min(finite) - 0.2), max(math.log(256), *finite) + 0.2)
    _save_loss_axes(fig, ax, "loss (nats / token)", title, 10, path)


def plot_plan_heatmap(plan, path: str | os.PathLike, title: str | None = None) -> None:
    """`plan`: a planner.Plan."""
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


def plot_branch_gaps(path: str | os.PathLike, curves: Mapping[str, tuple[Sequence[int], Sequence[Sequence[float]]]],
                     title: str | None = None) -> None:
    """`curves`: {method: (evaluation steps, [validation-loss gap to the bf16 branch at those steps, per
    seed])}; draws each method's mean gap over seeds and, with several seeds, their range (a seed's curve
    may be shorter: its branch diverged)."""
    fig = _figure(7.5, 4.4)
    ax = fig.add_subplot(1, 1, 1)
    ax.axhline(0.0, color="black", lw=0.8, label="bf16 branch")
    for i, (label, (steps, per_seed)) in enumerate(curves.items()):
        n = min(len(gaps) for gaps in per_seed)
        columns = [[gaps[k] for gaps in per_seed] for k in range(n)]
        mean = [sum(c) / len(c) for c in columns]
        ax.plot(steps[:n], mean, "o-", color=f"C{i}", lw=1.5, ms=3,
                label=f"{label} ({mean[-1]:+.4f})" if mean else label)
        if len(per_seed) > 1:
            ax.fill_between(steps[:n], [min(c) for c in columns], [max(c) for c in columns], color=f"C{i}",
                            alpha=0.15, lw=0)
    _save_loss_axes(fig, ax, "validation loss - bf16 branch's (nats / token)", title, 9, path)


def plot_sweep_heatmaps(summary: dict[str, Any], path: str | os.PathLike, title: str | None = None) -> None:
    import numpy as np

    precisions, lrs = summary["precisions"], summary["learning_rates"]
    rate = np.full((len(precisions), len(lrs)), np.nan)
    loss = np.full_like(rate, np.nan)
    text = [["" for _ in lrs] for _ in precisions]
    for i, p in enumerate(precisions):
        for j, lr in enumerate(lrs):
            c = summary["table"][p]["by_lr"][repr(lr)]
            if c["n"]:
                rate[i, j] = c["rate"]
                text[i][j] = f"{c['diverged']}/{c['n']}"
            if c["mean_final_loss"] is not None:
                loss[i, j] = c["mean_final_loss"]

    fig = _figure(3.2 + 1.5 * len(lrs), 1.4 + 0.42 * len(precisions))
    panels = [("divergence rate over seeds", rate, "Reds", (0.0, 1.0)),
              ("mean final loss (runs that did not diverge)", loss, "viridis", None)]
    for k, (name, values, cmap, limits) in enumerate(panels):
        ax = fig.add_subplot(1, 2, k + 1)
        finite = values[np.isfinite(values)]
        vmin, vmax = limits if limits else ((finite.min(), finite.max()) if finite.size else (0.0, 1.0))
        image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        for i in range(len(precisions)):
            for j in range(len(lrs)):
                label = text[i][j] if k == 0 else ("" if math.isnan(values[i, j]) else f"{values[i, j]:.2f}")
                if label:
                    level = (values[i, j] - vmin) / ((vmax - vmin) or 1.0)
                    dark = level > 0.6 if k == 0 else level < 0.4  # Reds darkens upwards, viridis downwards
                    ax.text(j, i, label, ha="center", va="center", fontsize=7, color="white" if dark else "black")
        ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs])
        ax.set_yticks(range(len(precisions)), precisions)
        ax.set_xlabel("peak learning rate")
        ax.set_title(name, fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)


def plot_sweep_sharpness(summary: dict[str, Any], path: str | os.PathLike, title: str | None = None) -> None:
    from matplotlib.ticker import FormatStrFormatter

    step = summary["early_sharpness_step"]
    directions = list(summary["sharpness_vs_divergence"])
    fig = _figure(5.0 * max(1, len(directions)), 4.0)
    for k, direction in enumerate(directions):
        ax = fig.add_subplot(1, max(1, len(directions)), k + 1)
        for diverged, colour, label in ((False, "tab:blue", "did not diverge"), (True, "tab:red", "diverged")):
            xs, ys = [], []
            for v in summary["verdicts"]:
                if bool(v["diverged"]) != diverged or v["diverged"] is None:
                    continue
                s = v["early_sharpness"].get(direction)
                if s is None:
                    continue
                xs.append(s)
                # diverged cells without a final loss are drawn at the top of the axis
                ys.append(v["final_loss"] if v["final_loss"] is not None else float("nan"))
            top = max([y for y in ys if not math.isnan(y)] + [math.log(256)])
            ax.scatter(xs, [top if math.isnan(y) else y for y in ys], s=14, c=colour, alpha=0.7, label=label)
        corr = summary["sharpness_vs_divergence"][direction]["all"]
        auc = "n/a" if corr["auc"] is None else f"{corr['auc']:.2f}"
        ax.set_xscale("log")
        ax.set_yscale("log")  # blown-up runs end orders of magnitude above the rest
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
        ax.set_xlabel(f"sharpness at step {step} ({direction} directions), KL/rho^2")
        ax.set_ylabel("final held-out loss (nats/token)")
        ax.set_title(f"{direction}: AUC(divergence) = {auc}, n = {corr['n']}", fontsize=9)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
