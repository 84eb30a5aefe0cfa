"""PNG plots (matplotlib, Agg canvas: no display and no global backend switch needed)."""

from __future__ import annotations

import math
import os
from typing import Sequence

__all__ = ["ema", "plot_losses"]


def ema(values: Sequence[float], alpha: float = 0.1) -> list[float]:
    """Bias-corrected exponential moving average (non-finite values are skipped)."""
    out, m, w = [], 0.0, 0.0
    for v in values:
        if math.isfinite(v):
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
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2), dpi=110)
    FigureCanvasAgg(fig)
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
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token)")
    finite = [v for v in list(train_loss) + list(val_loss) if math.isfinite(v)]
    if finite:
        ax.set_ylim(max(0.0, min(finite) - 0.2), max(math.log(256), *finite) + 0.2)
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.fspath(path))
