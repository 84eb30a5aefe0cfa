"""The picture of the stability paper's sharpness in a sweep (`epsilon-sharpness.png`), next to the shared
pictures of `snip_train.plots` (heat maps; our sharpness against the final loss).

Two panels, one point per cell measured: the early epsilon-sharpness against the final held-out loss, and
against our early sharpness in random directions; diverged cells in red. A PNG on a matplotlib Agg
canvas (no display, no global backend switch).
"""

from __future__ import annotations

import math
import os
from typing import Any

__all__ = ["plot_epsilon_sharpness"]


def plot_epsilon_sharpness(summary: dict[str, Any], path: str | os.PathLike, title: str | None = None) -> None:
    """`summary`: `analysis.summarize`'s, of a sweep that measured the paper's sharpness ("epsilon")."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    step = summary["early_sharpness_step"]
    fig = Figure(figsize=(10.0, 4.0), dpi=110)
    FigureCanvasAgg(fig)
    loss_ax, ours_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    judged = [v for v in summary["verdicts"] if v["diverged"] is not None and v["early_sharpness"].get("epsilon") is not None]
    finite_losses = [v["final_loss"] for v in judged if v["final_loss"] is not None]
    top = max(finite_losses + [math.log(256)])  # diverged cells without a final loss are drawn at the top
    for diverged, colour, label in ((False, "tab:blue", "did not diverge"), (True, "tab:red", "diverged")):
        cells = [v for v in judged if v["diverged"] == diverged]
        eps = [v["early_sharpness"]["epsilon"] for v in cells]
        loss_ax.scatter(eps, [top if v["final_loss"] is None else v["final_loss"] for v in cells],
                        s=14, c=colour, alpha=0.7, label=label)
        paired = [(e, v["early_sharpness"].get("random")) for e, v in zip(eps, cells)]
        paired = [(e, r) for e, r in paired if r is not None]
        ours_ax.scatter([r for _, r in paired], [e for e, _ in paired], s=14, c=colour, alpha=0.7, label=label)

    corr = summary["sharpness_vs_divergence"].get("epsilon", {}).get("all", {})
    auc = "n/a" if corr.get("auc") is None else f"{corr['auc']:.2f}"
    loss_ax.set_xscale("log")
    loss_ax.set_yscale("log")  # blown-up runs end orders of magnitude above the rest
    loss_ax.set_xlabel(f"epsilon-sharpness at step {step} (% of 1 + f)")
    loss_ax.set_ylabel("final held-out loss (nats/token)")
    loss_ax.set_title(f"the paper's sharpness: AUC(divergence) = {auc}, n = {corr.get('n', 0)}", fontsize=9)

    agreement = summary.get("metric_agreement", {}).get("random", {})
    spearman = "n/a" if agreement.get("spearman") is None else f"{agreement['spearman']:.2f}"
    ours_ax.set_xscale("log")
    ours_ax.set_yscale("log")
    ours_ax.set_xlabel(f"our sharpness at step {step}, random directions (KL/rho^2)")
    ours_ax.set_ylabel(f"epsilon-sharpness at step {step} (% of 1 + f)")
    ours_ax.set_title(f"the paper's against ours: Spearman = {spearman}", fontsize=9)
    for ax in (loss_ax, ours_ax):
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers at the decades only: log-scale minor labels collide
            axis.set_major_formatter(FormatStrFormatter("%g"))
            axis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    loss_ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))  # final losses span less than a decade
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(os.fspath(path))
