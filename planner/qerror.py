"""Quantization error per layer, per GEMM, per candidate precision (DESIGN.md §4.2).

On the recorded operands (x and dy row samples, the full weight) each GEMM is run once exactly
(float32) and once through `snip_ops.gemm` under the candidate recipe; the error is relative and
squared:

    e_fwd   = ||Q(x) Q(w)^T  - x w^T ||^2 / ||x w^T ||^2
    e_dgrad = ||Q(dy) Q(w)   - dy w  ||^2 / ||dy w  ||^2
    e_wgrad = ||Q(dy)^T Q(x) - dy^T x||^2 / ||dy^T x||^2

bf16 is the planner's reference (the high-precision GEMM), so its errors are 0 by definition.
Stochastic rounding (FP4 gradients) draws its bits from a fixed (seed, offset): errors are
deterministic for a given seed.
"""

from __future__ import annotations

from typing import Iterable

import torch

from snip_ops import gemm
from snip_ops.formats import GEMMS, recipe

from .stats import LayerRecording

__all__ = ["relative_error", "gemm_errors"]


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """||approx - exact||^2 / ||exact||^2 (0 when both are zero; inf when only exact is)."""
    num = float((approx.double() - exact.double()).pow(2).sum())
    den = float(exact.double().pow(2).sum())
    if den == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / den


def gemm_errors(rec: LayerRecording, candidates: Iterable[str], seed: int = 0) -> dict[str, dict[str, float]]:
    """{precision: {"fprop": e_fwd, "dgrad": e_dgrad, "wgrad": e_wgrad}} for one recorded layer."""
    x, dy, w = rec.x, rec.dy, rec.weight.float()
    exact = {"fprop": x @ w.t(), "dgrad": dy @ w, "wgrad": dy.t() @ x}
    out = {}
    for name in candidates:
        r = recipe(name)
        if r.is_bf16:
            out[name] = {g: 0.0 for g in GEMMS}
            continue
        approx = {
            "fprop": gemm.fprop(x, w, r, seed=seed, offset=0),
            "dgrad": gemm.dgrad(dy, w, r, seed=seed, offset=0),
            "wgrad": gemm.wgrad(dy, x, r, seed=seed, offset=0),
        }
        out[name] = {g: relative_error(approx[g], exact[g]) for g in GEMMS}
    return out
