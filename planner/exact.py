"""Exact optimum of the precision ILP: a certificate that a plan is optimal, or a better plan (docs/design.md §4.5).

With one budget row per pipeline stage over disjoint units, the ILP splits into one multiple-choice
knapsack per stage: pick one option j for every unit i, minimise sum v_ij subject to sum w_ij <= capacity
(weights >= 0). For a multiplier lam >= 0 let m_i = min_j (v_ij + lam w_ij) and r_ij = v_ij + lam w_ij - m_i
>= 0 (the reduced cost). Every choice x then satisfies

    value(x) = L + sum_i r_i(x_i) + lam * (capacity - weight(x)),        L = sum_i m_i - lam * capacity,

so a choice within the capacity that uses option ij is worth at least L + r_ij. At the multiplier of the
LP relaxation (greedy on each unit's lower convex hull) L is the LP bound; options whose reduced cost
lifts it to the value of a known plan are ruled out. A depth-first branch and bound over the options
left either proves that plan optimal or finds a better one. It bounds each node by the LP relaxation of
the units still open, with the room rounded down to a multiple of the gcd of their weights, and merges
nodes of equal depth and weight (see `search`).

All of it runs in exact integer arithmetic: the objective terms are integer multiples of one power of
two, the weights of another, so sums, bounds and comparisons are exact. A plan is certified optimal when
no plan is better by more than REL_TOL of its value: exact up to float64 summation. The capacity must
admit every plan the caller's budget check accepts; a plan becomes the incumbent only after that check.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

__all__ = ["REL_TOL", "NODE_LIMIT", "Knapsack", "Relaxation", "Certificate", "relax", "fill", "search"]

REL_TOL = 1e-12       # certified: no plan is better by more than this fraction of the plan's value
NODE_LIMIT = 100_000  # search nodes per stage (~1 s); the instances benchmarked and tested needed under 6,000


@dataclass(frozen=True)
class Knapsack:
    """One stage: per unit and option its objective term (`values`) and budget term (`weights`, >= 0)."""

    values: tuple[tuple[float, ...], ...]
    weights: tuple[tuple[float, ...], ...]
    capacity: float

    def __post_init__(self):
        terms = [t for row in self.values + self.weights for t in row] + [self.capacity]
        if not all(math.isfinite(t) for t in terms):
            raise ValueError("objective and budget terms must be finite numbers")
        if any(t < 0 for row in self.weights for t in row):
            raise ValueError("budget terms must be >= 0")

    def value(self, choice: Sequence[int]) -> float:
        return math.fsum(self.values[i][j] for i, j in enumerate(choice))

    def lightest(self) -> tuple[int, ...]:
        """Every unit's lightest option (the better of equally light ones): the plan most likely to fit."""
        return tuple(min(range(len(w)), key=lambda j: (w[j], v[j])) for v, w in zip(self.values, self.weights))


@dataclass(frozen=True)
class Certificate:
    choice: tuple[int, ...]
    value: float    # math.fsum of the choice's objective terms
    optimal: bool   # no plan is better by more than REL_TOL of `value`
    gap: float      # how far `value` may be above the optimum: 0 when optimal
    nodes: int      # search nodes visited


def _exponent(numbers: Iterable[float]) -> int:
    """E such that every number is an integer multiple of 2**E."""
    return min((math.frexp(x)[1] - 53 for x in numbers if x), default=0)


def _integer(x: float, exponent: int) -> int:
    """floor(x / 2**exponent), exact."""
    mantissa, e = math.frexp(x)
    m, shift = int(mantissa * 2 ** 53), e - 53 - exponent
    return m << shift if shift >= 0 else m >> -shift


def _frontier(v: Sequence[int], w: Sequence[int], options: Iterable[int]) -> list[int]:
    """Options that no other matches in weight and beats in value (first of equals), lightest first."""
    out: list[int] = []
    for j in sorted(options, key=lambda j: (w[j], v[j], j)):
        if not out or v[j] < v[out[-1]]:
            out.append(j)
    return out


def _lower_hull(v: Sequence[int], w: Sequence[int], options: Iterable[int]) -> list[int]:
    """The frontier's vertices on its lower convex hull (value over weight), lightest first."""
    hull: list[int] = []
    for j in _frontier(v, w, options):
        while len(hull) >= 2 and ((v[hull[-1]] - v[hull[-2]]) * (w[j] - w[hull[-2]])
                                  >= (v[j] - v[hull[-2]]) * (w[hull[-1]] - w[hull[-2]])):
            hull.pop()  # on or above the chord from its lighter neighbour to j
        hull.append(j)
    return hull


def _rate_key(bits: int) -> Callable[[int, int], int]:
    """An integer key ordering rates dv / dw (dw < 2**bits) exactly: distinct rates differ by more than
    2**-(2 bits), so floor(dv 2**(2 bits + 1) / dw) never merges them."""
    return lambda dv, dw: (dv << (2 * bits + 1)) // dw


def _tolerance(value: int) -> int:
    """REL_TOL of an integer value, rounded down (integer arithmetic: values can exceed a float's range)."""
    return abs(value) // round(1 / REL_TOL)


def _float(num: int, den: int, exponent: int) -> float:
    """num / den * 2**exponent, without overflowing on the way (the result is an objective value)."""
    shift = max(abs(num).bit_length() - den.bit_length() - 1000, 0)
    return math.ldexp(num / (den << shift), exponent + shift)


@dataclass(frozen=True)
class Relaxation:
    """The knapsack in integers, with its LP relaxation (see `relax`)."""

    knapsack: Knapsack
    value_exp: int                # objective terms are v * 2**value_exp
    v: tuple[tuple[int, ...], ...]
    w: tuple[tuple[int, ...], ...]
    capacity: int                 # the most weight a plan can have, in the weights' integer units
    rate: tuple[int, int]         # the multiplier lam = rate[0] / rate[1] (value per weight)
    lower: int                    # L, times rate[1]
    reduced: tuple[tuple[int, ...], ...]  # r_ij, times rate[1]
    rounded: tuple[int, ...]      # the LP solution with its fractional unit on the lighter vertex

    def exact_value(self, choice: Sequence[int]) -> int:
        return sum(self.v[i][j] for i, j in enumerate(choice))

    def allowed(self, incumbent: Sequence[int]) -> list[list[int]]:
        """Per unit, the frontier options that some plan better than `incumbent` (by more than REL_TOL) may
        use, by reduced cost; a unit left with none means that no plan is better."""
        value = self.exact_value(incumbent)
        cut = (value - _tolerance(value)) * self.rate[1]
        return [sorted((j for j in _frontier(vi, wi, range(len(vi))) if self.lower + r[j] < cut), key=r.__getitem__)
                for vi, wi, r in zip(self.v, self.w, self.reduced)]


def relax(ks: Knapsack) -> Relaxation:
    """The knapsack's terms as exact integers (objective terms and weights each an integer multiple of one
    power of two) and its LP relaxation: every unit on its heaviest hull vertex (least value), then steps
    to lighter vertices in order of value added per weight saved until the plan fits; the last step's
    rate is the multiplier."""
    value_exp = _exponent(x for row in ks.values for x in row)
    weight_exp = _exponent(x for row in ks.weights for x in row)
    v = tuple(tuple(_integer(x, value_exp) for x in row) for row in ks.values)
    w = tuple(tuple(_integer(x, weight_exp) for x in row) for row in ks.weights)
    grain = math.gcd(*(x for row in w for x in row)) or 1  # every plan weighs a multiple of it
    capacity = _integer(ks.capacity, weight_exp) // grain * grain
    key = _rate_key(max((x for row in w for x in row), default=0).bit_length())
    hulls = [_lower_hull(vi, wi, range(len(vi))) for vi, wi in zip(v, w)]
    at = [len(h) - 1 for h in hulls]

    def step(i: int) -> tuple[int, int]:
        heavy, light = hulls[i][at[i]], hulls[i][at[i] - 1]
        return v[i][light] - v[i][heavy], w[i][heavy] - w[i][light]

    weight = sum(wi[h[-1]] for wi, h in zip(w, hulls))
    steps = [(key(*step(i)), i) for i in range(len(hulls)) if at[i] > 0]
    heapq.heapify(steps)
    rate = (0, 1)
    while weight > capacity:
        if not steps:
            raise ValueError(f"no plan fits the capacity {ks.capacity:.6g}")
        _, i = heapq.heappop(steps)
        rate = step(i)
        weight -= rate[1]
        at[i] -= 1
        if at[i] > 0:
            heapq.heappush(steps, (key(*step(i)), i))
    priced = [[x * rate[1] + rate[0] * y for x, y in zip(vi, wi)] for vi, wi in zip(v, w)]
    least = [min(p) for p in priced]
    return Relaxation(ks, value_exp, v, w, capacity, rate, sum(least) - rate[0] * capacity,
                      tuple(tuple(x - m for x in p) for p, m in zip(priced, least)),
                      tuple(h[a] for h, a in zip(hulls, at)))


def fill(rx: Relaxation, choice: Sequence[int]) -> tuple[int, ...]:
    """`choice` after single-unit switches to options of lower value that still fit the capacity, largest
    gains first: a primal heuristic (the better the known plan, the more options the bound rules out)."""
    v, w, choice = rx.v, rx.w, list(choice)
    room = rx.capacity - sum(w[i][j] for i, j in enumerate(choice))
    while True:
        moves = sorted((v[i][k] - v[i][j], i, k) for i, j in enumerate(choice) for k in range(len(v[i]))
                       if v[i][k] < v[i][j] and w[i][k] - w[i][j] <= room)
        if not moves:
            return tuple(choice)
        for _, i, k in moves:
            extra = w[i][k] - w[i][choice[i]]
            if v[i][k] < v[i][choice[i]] and extra <= room:
                choice[i] = k
                room -= extra


class _SuffixLP:
    """LP relaxations of the units from depth d on (the units in branching order), at any capacity.

    Each unit contributes its heaviest allowed hull vertex (least value) plus steps to lighter vertices.
    The steps of all units sit in one array ordered by rate (value added per weight saved); Fenwick trees
    over it sum the weight shed and value added by the steps of active units, so the LP at a deficit D
    (weight to shed) is a prefix search: the steps that shed less than D, plus the fraction of the step
    that crosses D. The room is first rounded down to a multiple of the gcd of the units' weights, which
    no plan can use anyway: on budgets that fall between two weight multiples this closes most of the
    LP's gap.
    """

    def __init__(self, v: Sequence[Sequence[int]], w: Sequence[Sequence[int]], units: list[int],
                 allowed: list[list[int]]):
        key = _rate_key(max((x for i in units for x in w[i]), default=0).bit_length())
        depth = len(units)
        self.base_v, self.base_w, self.shed = [0] * (depth + 1), [0] * (depth + 1), [0] * (depth + 1)
        steps = []
        for d in range(depth - 1, -1, -1):
            i = units[d]
            hull = _lower_hull(v[i], w[i], allowed[i])
            self.base_v[d] = self.base_v[d + 1] + v[i][hull[-1]]
            self.base_w[d] = self.base_w[d + 1] + w[i][hull[-1]]
            self.shed[d] = self.shed[d + 1] + w[i][hull[-1]] - w[i][hull[0]]
            for k in range(len(hull) - 1, 0, -1):
                dv, dw = v[i][hull[k - 1]] - v[i][hull[k]], w[i][hull[k]] - w[i][hull[k - 1]]
                steps.append((key(dv, dw), d, -k, dv, dw))  # heavier steps of a unit first on equal keys
        steps.sort()
        self.size = len(steps)
        self.dv = [0] + [s[3] for s in steps]
        self.dw = [0] + [s[4] for s in steps]
        self.positions: list[list[int]] = [[] for _ in range(depth)]
        for p, s in enumerate(steps, 1):
            self.positions[s[1]].append(p)
        self.tree_v, self.tree_w = self.dv[:], self.dw[:]
        for p in range(1, self.size + 1):  # Fenwick build, every unit active
            q = p + (p & -p)
            if q <= self.size:
                self.tree_v[q] += self.tree_v[p]
                self.tree_w[q] += self.tree_w[p]
        self.active_from = 0
        self.grain = math.gcd(*(w[i][j] for i in units for j in allowed[i])) or 1

    def _add(self, p: int, sign: int) -> None:
        dv, dw = sign * self.dv[p], sign * self.dw[p]
        while p <= self.size:
            self.tree_v[p] += dv
            self.tree_w[p] += dw
            p += p & -p

    def activate(self, d: int) -> None:
        """Make the units from depth d on active, those before it inactive."""
        while self.active_from < d:
            for p in self.positions[self.active_from]:
                self._add(p, -1)
            self.active_from += 1
        while self.active_from > d:
            self.active_from -= 1
            for p in self.positions[self.active_from]:
                self._add(p, 1)

    def bound(self, room: int) -> tuple[int, int] | None:
        """(numerator, denominator) of the LP value of the active units within `room`, None if none fits."""
        d = self.active_from
        deficit = self.base_w[d] - room // self.grain * self.grain
        if deficit <= 0:
            return self.base_v[d], 1
        if deficit > self.shed[d]:
            return None
        pos, shed, added, bit = 0, 0, 0, 1 << self.size.bit_length()
        while bit:
            q = pos + bit
            if q <= self.size and shed + self.tree_w[q] < deficit:
                pos, shed, added = q, shed + self.tree_w[q], added + self.tree_v[q]
            bit >>= 1
        dv, dw = self.dv[pos + 1], self.dw[pos + 1]  # the step that crosses the deficit
        return (self.base_v[d] + added) * dw + (deficit - shed) * dv, dw


def search(rx: Relaxation, incumbent: Sequence[int], feasible: Callable[[tuple[int, ...]], bool],
           node_limit: int = NODE_LIMIT) -> Certificate:
    """The best of `incumbent` (which must pass `feasible`) and every plan the branch and bound reaches,
    with the proof. `feasible` is the caller's exact budget check, which the capacity only bounds; its
    verdict must depend on a plan's weight alone (as a budget's does, up to rounding).

    Units are decided in a fixed order, so a node is its depth, weight and value so far: a node whose
    depth and weight match an explored one of no greater value has nothing new below it. That merges the
    many orders in which units of equal weights can be chosen (dynamic programming over weights).
    """
    ks, v, w = rx.knapsack, rx.v, rx.w
    best, best_value = tuple(incumbent), rx.exact_value(incumbent)
    allowed = rx.allowed(best)
    if not all(allowed):
        return Certificate(best, ks.value(best), True, 0.0, 0)
    n = len(v)
    fixed = [i for i in range(n) if len(allowed[i]) == 1]
    # Widest weight range first (its choice moves the bound most); equal weights side by side (they merge).
    free = sorted((i for i in range(n) if len(allowed[i]) > 1),
                  key=lambda i: (min(w[i][j] for j in allowed[i]) - max(w[i][j] for j in allowed[i]),
                                 sorted(w[i][j] for j in allowed[i])))
    fixed_v = sum(v[i][allowed[i][0]] for i in fixed)
    room = rx.capacity - sum(w[i][allowed[i][0]] for i in fixed)
    lp = _SuffixLP(v, w, free, allowed)
    depth = len(free)
    cut = best_value - _tolerance(best_value)  # a node whose bound reaches it cannot lead to a better plan
    root = lp.bound(room)
    if root is None:
        return Certificate(best, ks.value(best), True, 0.0, 0)
    stack = [(0, -1, fixed_v, 0, root[0] + fixed_v * root[1], root[1])]
    path, nodes, explored = [0] * depth, 0, {}
    while stack and nodes < node_limit:
        d, j, acc_v, acc_w, num, den = stack.pop()
        if num >= cut * den or explored.get((d, acc_w), acc_v + 1) <= acc_v:
            continue  # the incumbent improved, or an equal-weight node no worse was explored, since it was queued
        explored[d, acc_w] = acc_v
        nodes += 1
        if d:
            path[d - 1] = j
        if d == depth:
            choice = [allowed[i][0] for i in range(n)]
            for i, k in zip(free, path):
                choice[i] = k
            if feasible(tuple(choice)):
                best, best_value = tuple(choice), acc_v
                cut = best_value - _tolerance(best_value)
            continue
        lp.activate(d + 1)
        children = []
        i = free[d]
        for k in allowed[i]:
            rest = lp.bound(room - acc_w - w[i][k])
            if rest is not None:
                child = (rest[0] + (acc_v + v[i][k]) * rest[1], rest[1])
                if child[0] < cut * child[1]:
                    children.append((_float(*child, rx.value_exp), k, child))
        for _, k, child in sorted(children, reverse=True):  # the least bound is explored first
            stack.append((d + 1, k, acc_v + v[i][k], acc_w + w[i][k], *child))
    value = ks.value(best)
    open_bounds = [_float(num, den, rx.value_exp) for *_, num, den in stack if num < cut * den]
    if not open_bounds:
        return Certificate(best, value, True, 0.0, nodes)
    return Certificate(best, value, False, max(value - min(open_bounds), 0.0), nodes)
