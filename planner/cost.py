"""What a plan costs: GEMM shapes, cost models (theoretical or measured) and budgets (docs/design.md §4.5).

A linear layer `y = x w^T` with M tokens, K inputs and N outputs runs three GEMMs; each is written
here as (m, n, k) = (output rows, output columns, reduced dimension):

    fprop  y  = x w^T     (M, N, K)
    dgrad  dx = dy w      (M, K, N)
    wgrad  dw = dy^T x    (N, K, M)

all 2*M*N*K FLOPs. A cost model prices one GEMM in one format; a `Budget` bounds the plan, either as
"at least X of the linear FLOPs in 4-bit formats" or as "total cost at most r times the all-bf16
cost" under a cost model. `TheoreticalCost()` prices each recipe at its nominal speed-up;
`TheoreticalCost(arch=(9, 0))` at the speed of the GEMM path each of its GEMMs actually takes on that
GPU (snip_ops.gemm_kernels.gemm_path: e.g. FP4 on Hopper runs on the FP8 kernel, MX/NV formats there
on BF16 tensor cores).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Literal, Mapping, Protocol

from snip_ops.formats import GEMMS, gemm_dims, recipe

__all__ = [
    "LayerShape", "gemm_shape", "gemm_flops", "layer_shapes", "is_fp4", "CostModel", "TheoreticalCost", "PATH_SPEEDUP",
    "MeasuredCost", "Budget", "PlanMetrics", "plan_metrics",
]


@dataclass(frozen=True)
class LayerShape:
    """A linear layer as the planner sees it: its name and GEMM dimensions per training step."""

    name: str
    in_features: int   # K
    out_features: int  # N
    tokens: int        # M, rows of x in one training step


def gemm_shape(layer: LayerShape, gemm: str) -> tuple[int, int, int]:
    """(m, n, k) of one of the layer's GEMMs, k being the reduced dimension."""
    return gemm_dims(gemm, layer.tokens, layer.out_features, layer.in_features)


def gemm_flops(layer: LayerShape, gemm: str) -> float:
    m, n, k = gemm_shape(layer, gemm)
    return 2.0 * m * n * k


def layer_shapes(stats_layers, tokens: int | None = None) -> dict[str, LayerShape]:
    """{layer: shape} of recorded layer statistics, with M set to `tokens` (the tokens of one training
    step, for measured costs) when it is given."""
    return {s.name: s.shape if tokens is None else LayerShape(s.name, s.shape.in_features, s.shape.out_features, tokens)
            for s in stats_layers}


def is_fp4(precision: str) -> bool:
    """True for recipes whose quantized operands are all 4-bit (fp4, nvfp4, mxfp4)."""
    r = recipe(precision)
    specs = [s for s in (r.act, r.weight, r.grad) if s is not None]
    return bool(specs) and all(s.element.bits == 4 for s in specs)


class CostModel(Protocol):
    name: str

    def gemm_cost(self, layer: LayerShape, gemm: str, precision: str) -> float: ...


# Nominal throughput over a BF16 GEMM of each path of snip_ops.gemm_kernels.qgemm, on the GPU it runs
# on: the tensor cores' rate ratio. The kernels reach less than that, wgrad and sm90_fp4 (whose E2M1 ->
# E4M3 re-encoding is a pass of its own) least (bench/results/nvidia-h200-gemm.json). For a time budget,
# price with a measured table (MeasuredCost) rather than with these.
PATH_SPEEDUP: Mapping[str, float] = {
    "sm90_fp8": 2.0,
    "sm90_fp4": 2.0,        # FP4 on Hopper is the FP8 kernel on re-encoded codes
    "sm100_fp8": 2.0,
    "sm100_fp4": 2.0,       # FP32-scaled FP4: the FP8 blockwise kernel, as on Hopper
    "sm100_mxfp8": 2.0,
    "sm100_nvfp4": 4.0,
    "sm100_mxfp4": 4.0,
    "bf16_exact": 1.0,      # a BF16 GEMM of the dequantized operands
    # A BF16 GEMM per 128-wide K chunk whose FP32 partial sums go through memory: memory-bound,
    # about 5-30x below a BF16 GEMM depending on the GPU's FLOP/byte ratio; 1/8 is a middle estimate
    # (MeasuredCost has the real number).
    "blockwise_bf16": 1.0 / 8,
    "fp32": 1.0 / 16,       # an FP64 GEMM on a GPU (H100's FP64 tensor-core rate; slower on most)
}


@dataclass(frozen=True)
class TheoreticalCost:
    """GEMM FLOPs divided by a throughput factor over BF16.

    arch None (default): the recipe's nominal factor (bf16 1, fp8 2, fp4 4), whatever runs it.
    arch (major, minor): the factor of the path (PATH_SPEEDUP) that the GEMM takes on a GPU of that
    compute capability with every kernel built, by snip_ops.gemm_kernels.gemm_path -- qgemm's own
    rules, so the price follows the path that runs (FP4 on sm_90 at the FP8 kernel's nominal speed,
    MX/NV formats there at BF16 speed, FP32-scaled formats without a kernel below it). Nominal:
    PATH_SPEEDUP says how far an H100 falls short of it; MeasuredCost prices the measured times.
    """

    name: str = "theoretical"
    arch: tuple[int, int] | None = None

    def __post_init__(self):
        if self.arch is not None:
            arch = tuple(self.arch)
            if len(arch) != 2 or not all(isinstance(v, int) and v >= 0 for v in arch):
                raise ValueError(f"arch must be a compute capability (major, minor), got {self.arch!r}")
            object.__setattr__(self, "arch", arch)
            if self.name == "theoretical":
                object.__setattr__(self, "name", f"theoretical_sm{arch[0]}{arch[1]}")

    def speedup(self, layer: LayerShape, gemm: str, precision: str) -> float:
        """The GEMM's throughput factor over BF16 under this model."""
        r = recipe(precision)
        if self.arch is None or r.is_bf16:
            return r.speedup
        if None in (r.act, r.weight, r.grad):  # partly quantized: emulated (snip_ops.gemm), in FP64 on a GPU
            return PATH_SPEEDUP["fp32"]
        from snip_ops.gemm_kernels import gemm_path

        return PATH_SPEEDUP[gemm_path(r, gemm, self.arch, mnk=gemm_shape(layer, gemm)).path]

    def gemm_cost(self, layer: LayerShape, gemm: str, precision: str) -> float:
        return gemm_flops(layer, gemm) / self.speedup(layer, gemm, precision)


@dataclass(frozen=True)
class MeasuredCost:
    """Measured GEMM times on one device, looked up by (m, n, k, format) and, where the table says, the GEMM.

    JSON (`snip cost` / snip_ops.gemm_timing.measure: each GEMM with its operands' quantization; the GEMM
    microbenchmarks in bench/: the kernel alone):
        {"device": "NVIDIA H100", "unit": "s",
         "entries": [{"m": 4096, "n": 4096, "k": 4096, "format": "fp8", "gemm": "wgrad", "time": 1.9e-4}, ...]}
    "gemm" is optional: an entry without it prices that shape in any GEMM. A GEMM's price is its own
    entry, else the shape's entry without a GEMM, else the entry of the same format (and the same GEMM,
    where the table has any of it) with the nearest FLOP count, scaled by the FLOP ratio (GEMM time grows
    about linearly with FLOPs at these sizes); a format missing altogether is an error.
    """

    times: Mapping[tuple, float]  # (m, n, k, format) or (m, n, k, format, gemm) -> seconds
    device: str = "unknown"
    name: str = field(default="measured", init=False)

    def __post_init__(self):
        for key, t in self.times.items():
            if len(key) not in (4, 5) or (len(key) == 5 and key[4] not in GEMMS):
                raise ValueError(f"a measured GEMM time is keyed by (m, n, k, format[, gemm in {GEMMS}]), got {key!r}")
            if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
                raise ValueError(f"measured GEMM time for {key} must be a positive number, got {t!r}")

    @classmethod
    def from_json(cls, source: str | os.PathLike | Mapping) -> "MeasuredCost":
        obj = source if isinstance(source, Mapping) else json.loads(open(source).read())
        try:
            times = {(int(e["m"]), int(e["n"]), int(e["k"]), str(e["format"]))
                     + ((str(e["gemm"]),) if "gemm" in e else ()): float(e["time"])
                     for e in obj["entries"]}
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError("a GEMM time table is {'device': ..., 'entries': [{'m','n','k','format','time'}]}; "
                             f"could not read it: {e}") from None
        if not times:
            raise ValueError("the GEMM time table has no entries")
        return cls(times, str(obj.get("device", "unknown")))

    def formats(self) -> set[str]:
        return {key[3] for key in self.times}

    def gemm_cost(self, layer: LayerShape, gemm: str, precision: str) -> float:
        m, n, k = gemm_shape(layer, gemm)
        for key in ((m, n, k, precision, gemm), (m, n, k, precision)):
            if key in self.times:
                return self.times[key]
        same = [(key, t) for key, t in self.times.items() if key[3] == precision]
        if not same:
            raise ValueError(f"the GEMM time table ({self.device}) has no entry for format {precision!r}; "
                             f"it has {sorted(self.formats())}")
        same = [(key, t) for key, t in same if key[4:] == (gemm,)] or same
        flops = 2.0 * m * n * k
        (em, en, ek, *_), t = min(same, key=lambda kt: abs(math.log(2.0 * kt[0][0] * kt[0][1] * kt[0][2] / flops)))
        return t * flops / (2.0 * em * en * ek)


@dataclass(frozen=True)
class Budget:
    """The efficiency target of a plan.

    kind "fp4_fraction":  at least `value` of all planned linear FLOPs run in 4-bit formats;
    kind "relative_cost": total cost under `cost_model` at most `value` times the all-bf16 cost
                          (all fp8 = 0.5 and all fp4 = 0.25 under the theoretical model).
    """

    kind: Literal["fp4_fraction", "relative_cost"]
    value: float
    cost_model: CostModel = field(default_factory=TheoreticalCost)

    def __post_init__(self):
        if self.kind not in ("fp4_fraction", "relative_cost"):
            raise ValueError(f"budget kind must be 'fp4_fraction' or 'relative_cost', got {self.kind!r}")
        if not (isinstance(self.value, (int, float)) and math.isfinite(self.value)):
            raise ValueError(f"budget value must be a finite number, got {self.value!r}")
        if self.kind == "fp4_fraction" and not 0.0 <= self.value <= 1.0:
            raise ValueError(f"an FP4 FLOP fraction must be in [0, 1], got {self.value}")
        if self.kind == "relative_cost" and self.value <= 0:
            raise ValueError(f"a relative cost budget must be > 0, got {self.value}")

    @classmethod
    def fp4_fraction(cls, fraction: float) -> "Budget":
        return cls("fp4_fraction", float(fraction))

    @classmethod
    def relative_cost(cls, ratio: float, cost_model: CostModel | None = None) -> "Budget":
        return cls("relative_cost", float(ratio), cost_model or TheoreticalCost())

    @classmethod
    def parse(cls, text: str, cost_model: CostModel | None = None) -> "Budget":
        """"fp4=0.75" (at least 75% of FLOPs in FP4) or "cost=0.3" (30% of the all-bf16 cost)."""
        key, _, value = text.partition("=")
        try:
            number = float(value.rstrip("%")) / (100.0 if value.endswith("%") else 1.0)
        except ValueError:
            number = None
        if key.strip() == "fp4" and number is not None:
            return cls.fp4_fraction(number)
        if key.strip() == "cost" and number is not None:
            return cls.relative_cost(number, cost_model)
        raise ValueError(f"cannot parse budget {text!r}; write 'fp4=0.75' (FP4 FLOP fraction) or 'cost=0.3' "
                         "(cost relative to all-bf16)")

    def describe(self) -> str:
        if self.kind == "fp4_fraction":
            return f"at least {100 * self.value:.4g}% of linear FLOPs in FP4"
        return f"cost at most {self.value:.4g} x all-bf16 ({self.cost_model.name} cost)"

    def to_json(self) -> dict:
        out = {"kind": self.kind, "value": self.value, "cost_model": self.cost_model.name}
        if isinstance(self.cost_model, MeasuredCost):
            out["device"] = self.cost_model.device
        return out

    # A plan may miss the budget value by this much (absolute, on the fraction or the relative cost):
    # float rounding of the metrics must not turn a plan at the boundary into an infeasible one.
    TOLERANCE = 1e-9

    def satisfied_by(self, metrics: "PlanMetrics") -> bool:
        if self.kind == "fp4_fraction":
            return metrics.fp4_fraction >= self.value - self.TOLERANCE
        return metrics.relative_cost <= self.value + self.TOLERANCE


@dataclass(frozen=True)
class PlanMetrics:
    fp4_fraction: float   # share of linear FLOPs in 4-bit formats
    relative_cost: float  # cost / all-bf16 cost under the budget's cost model
    flops: float          # total linear FLOPs per step (all three GEMMs)


def plan_metrics(assignment: Mapping[tuple[str, str], str], shapes: Mapping[str, LayerShape],
                 cost_model: CostModel | None = None) -> PlanMetrics:
    """Metrics of a plan given as {(layer, gemm): precision} over every GEMM of `shapes`."""
    cost_model = cost_model or TheoreticalCost()
    flops = fp4 = cost = bf16 = 0.0
    for name, shape in shapes.items():
        for g in GEMMS:
            p = assignment[(name, g)]
            f = gemm_flops(shape, g)
            flops += f
            fp4 += f if is_fp4(p) else 0.0
            cost += cost_model.gemm_cost(shape, g, p)
            bf16 += cost_model.gemm_cost(shape, g, "bf16")
    return PlanMetrics(fp4 / flops if flops else 0.0, cost / bf16 if bf16 else 0.0, flops)
