"""PNG figures of a sweep summary (matplotlib on an Agg canvas: no display, no global backend switch).

* `plot_heatmaps`: precision x learning rate, left the divergence rate over seeds (annotated k/n),
  right the mean final held-out loss of the runs that did not diverge.
* `plot_sharpness`: early sharpness against final loss per cell, diverged cells marked, one panel per
  direction kind -- the picture behind the sharpness/divergence correlation.
"""

from __future__ import annotations

import math
import os
from typing import Any

__all__ = ["plot_heatmaps", "plot_sharpness"]


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def plot_heatmaps(summary: dict[str, Any], path: str | os.PathLike, title: str | None = None) -> None:
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


def plot_sharpness(summary: dict[str, Any], path: str | os.PathLike, title: str | None = None) -> None:
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
