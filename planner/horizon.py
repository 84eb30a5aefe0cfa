"""The share of its settled excess loss that gradient noise reaches within WD's horizon, under a
learning-rate schedule (divergence.py, "wd_horizon").

Along one parameter with curvature G and Adam preconditioner D, the iteration at learning rate
lr r_t (r_t the schedule relative to the learning rate at the plan's step, lr) contracts the deviation
by 1 - lr r_t D G per step and adds gradient noise of variance (lr r_t D)^2 s. With a = lr D G (the
contraction per step at lr), the variance in units of its stationary value at lr, phi, follows, step by
step with r_t held over the step (the exact solution of the continuous-time recursion),
    phi_{t+1} = phi_t exp(-2 r_t a) + r_t (1 - exp(-2 r_t a)),        phi_0 = 0,
and the excess loss after T steps is phi_T times the settled one at lr. A constant rate (r_t = 1) gives
phi_T = 1 - exp(-2 a T), the closed form of the constant-lr horizon. A decaying schedule lets the stiff
directions settle at the lower rate of the horizon's end (phi_T -> r_{T-1}) and the flat ones gather
2 a sum_t r_t^2 instead of 2 a T: in the last interval of a cosine decay WD shrinks towards LD's side.
A step with r_t = 0 (after the run ends) changes nothing.

phi_T is a function of a alone for a given schedule, so it is tabulated once on a log-spaced grid of a
and interpolated per parameter entry: T steps on the grid instead of T passes over every parameter
(a ~100-step horizon over ten million parameters would cost seconds). Off the grid: below it the
first-order value 2 a sum r_t^2 (relative error < 1e-4), above it the saturated value (every
exp(-2 r_t a) < exp(-100)).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

__all__ = ["HorizonTable", "horizon_fraction_exact"]

POINTS_PER_DECADE = 64  # linear interpolation in log a: error < (ln 10 / 64)^2 / 8 ~ 2e-4 of phi's scale


def _ratios(lr_ratios: Sequence[float]) -> list[float]:
    ratios = [float(r) for r in lr_ratios]
    if not ratios:
        raise ValueError("lr_ratios is empty: the horizon needs at least one step")
    if not all(math.isfinite(r) and r >= 0 for r in ratios):
        raise ValueError(f"lr_ratios must be finite and >= 0, got {ratios}")
    return ratios


def _step(phi: torch.Tensor, rate: torch.Tensor, r: float) -> torch.Tensor:
    decay = torch.exp(-2 * r * rate)
    return phi * decay + r * -torch.expm1(-2 * r * rate)


def horizon_fraction_exact(rate: torch.Tensor, lr_ratios: Sequence[float]) -> torch.Tensor:
    """phi_T(a) for `rate` = a elementwise by the recursion itself (T passes over `rate`): the reference."""
    rate = rate.double().clamp_min(0)
    phi = torch.zeros_like(rate)
    for r in _ratios(lr_ratios):
        phi = _step(phi, rate, r)
    return phi


class HorizonTable:
    """phi_T tabulated for one schedule `lr_ratios` [r_0 .. r_{T-1}] (the horizon's learning rates relative to
    the current one); call it on the rates a = lr D G of every parameter tensor (built once per re-plan)."""

    def __init__(self, lr_ratios: Sequence[float]):
        ratios = _ratios(lr_ratios)
        positive = [r for r in ratios if r > 0]
        self.empty = not positive
        if self.empty:
            return
        self.first_order = 2 * sum(r * r for r in ratios)
        self.lo = 5e-5 / sum(positive)  # 2 a sum r < 1e-4: phi's first-order value is exact to that
        self.hi = 50 / min(positive)     # exp(-2 r a) < exp(-100) for every r > 0: saturated
        self.points = max(2, math.ceil(POINTS_PER_DECADE * math.log10(self.hi / self.lo)) + 1)
        grid_log = torch.linspace(math.log(self.lo), math.log(self.hi), self.points, dtype=torch.float64)
        table = torch.zeros(self.points, dtype=torch.float64)
        grid = grid_log.exp()
        for r in ratios:
            table = _step(table, grid, r)
        self.step = (grid_log[1] - grid_log[0]).item()
        self.slopes = (table[1:] - table[:-1]).float()
        self.table = table[:-1].float()

    def __call__(self, rate: torch.Tensor) -> torch.Tensor:
        """phi_T(a) for `rate` = a elementwise (>= 0; negatives read as 0): float32, `rate`'s shape and device."""
        if self.empty:
            return torch.zeros_like(rate, dtype=torch.float32)
        if self.table.device != rate.device:
            self.table, self.slopes = self.table.to(rate.device), self.slopes.to(rate.device)
        a = rate.float().clamp_min(0)
        # the grid is uniform in log a: the cell and the position in it directly, no search
        pos = a.clamp(self.lo, self.hi).log_().sub_(math.log(self.lo)).mul_(1 / self.step)
        idx = pos.int().clamp_(max=self.points - 2).flatten()  # int32 index_select: half the time of int64 indexing
        phi = torch.addcmul(self.table.index_select(0, idx).view_as(pos), pos.sub_(idx.view_as(pos)),
                            self.slopes.index_select(0, idx).view_as(pos))
        return torch.where(a < self.lo, self.first_order * a, phi)
