"""eXmY bit-reduction simulation: any exponent/mantissa width on chosen GEMM operands (docs/design.md §5).

A simulated format is an ordinary `snip_ops` precision: `exmy_precision` builds a `LinearPrecision`
whose `GemmRecipe`s carry an eXmY `QuantSpec` on the chosen operands of the chosen GEMMs, so a model
converted with `snip_ops.convert(model, plan)` runs it through the same emulated GEMMs as FP8/FP4.

Semantics (all from `snip_ops.cast.round_to_format`, the reference element cast):

* Scaling. `scaling=None` (default) casts raw values (`ScaleKind.NONE`): the format's exponent range
  applies as is -- values above `max_finite` saturate to it ("clamping"), values below the smallest
  subnormal flush to zero. That is the point of E8-versus-E5/E4 studies: E8MY keeps FP32's range and
  only loses mantissa bits; E5M2/E4M3 also lose range. `scaling="tensor"` divides each operand by one
  FP32 scale `amax / max_finite` first (tensor-wise); `scaling=(rows, cols)` uses blocks of that shape
  (0 = whole dimension), as the FP8/FP4 recipes do.
* Rounding. RNE (round to nearest even), TRUNC (toward zero: masking the dropped mantissa bits) or
  SR (stochastic, Philox bits keyed per layer and step, docs/design.md §2). Saturation for all three.
* Operands. `act` = activations (x in fprop, x^T in wgrad), `weight` = w (fprop) and w^T (dgrad),
  `grad` = output gradients (dy in dgrad, dy^T in wgrad); `gemms` picks which of fprop / dgrad / wgrad
  are simulated at all. An operand outside the selection stays in the model's dtype (FP32 on the CPU).
  Accumulation is FP32. Embedding and output head are excluded by `convert`'s default filter.

A `Scheme` is the frozen, hashable description used by the sweep; its text form is
`<element>[:<rounding>][:<scaling>][:ops=<a+w+g>][:gemms=<fprop+dgrad+wgrad>]`, e.g. "e8m3",
"e4m3:sr", "e5m2:tensor", "e4m3:1x128", "e2m1:sr:tensor:ops=grad:gemms=dgrad+wgrad".

The stability paper's method (`paper_scheme`, text option "paper", e.g. "e7m2:paper", whose label is
"e7m2:trunc"): mantissa bits removed by masking, the exponent range clipped, no scaling -- TRUNC rounding
with `scaling=None` on an IEEE-style eXmY element. For a finite FP32 value x and E<e>M<m>
(emin = 2 - 2^(e-1), emax = 2^(e-1) - 1):

* 2^emin <= |x| <= max_finite: the FP32 bit pattern with its 23 - m low mantissa bits cleared;
* |x| > max_finite = (2 - 2^-m) 2^emax: +-max_finite (clipped; truncation never rounds up, so for E8
  formats, whose range is FP32's, nothing finite is clipped);
* |x| < 2^emin: truncated toward zero onto the subnormal grid, multiples of 2^(emin - m) (zero below
  the smallest of them), sign kept (-0 for small negatives). For E8 formats this is again FP32 bit
  masking (an FP32 subnormal's low mantissa bits cleared); E7 and E6 follow the same rule below their
  own 2^emin (2^-62, 2^-30). This is gradual underflow, not flush-to-zero below 2^emin: one rule for the
  whole ladder, the one masking itself gives for E8. A flush-to-zero variant would differ only on
  values below 2^emin;
* NaN stays NaN, +-Inf stays +-Inf.

tests/planner/test_stability_paper_exmy.py checks this bit for bit against a NumPy bit-masking oracle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from snip_ops.formats import (
    GEMMS, ElementFormat, GemmRecipe, LinearPrecision, QuantSpec, Rounding, ScaleKind, element_format, exmy,
)

__all__ = ["OPERANDS", "Scaling", "Scheme", "exmy_precision", "paper_scheme", "parse_scheme", "BIT_REDUCTION_LADDER",
           "PAPER_ROUNDING", "PAPER_SCALING"]

OPERANDS = ("act", "weight", "grad")

# None: no scaling; "tensor": one FP32 scale per operand; (rows, cols): FP32 scale per block.
Scaling = None | str | tuple[int, int]

# The stability paper's simulation: mask mantissa bits (truncation toward zero), no scaling (module docstring).
PAPER_ROUNDING = Rounding.TRUNC
PAPER_SCALING: Scaling = None

# "Remove one bit at a time": E8M7 (the BF16 layout) down to E8M1, then narrower exponents.
BIT_REDUCTION_LADDER = ("e8m7", "e8m6", "e8m5", "e8m4", "e8m3", "e8m2", "e8m1", "e5m2", "e4m3", "e3m2", "e2m1")


def _scale_of(scaling: Scaling) -> tuple[tuple[int, int], ScaleKind]:
    if scaling is None:
        return (0, 0), ScaleKind.NONE
    if scaling == "tensor":
        return (0, 0), ScaleKind.FP32
    if isinstance(scaling, tuple) and len(scaling) == 2 and all(isinstance(v, int) and v >= 0 for v in scaling):
        return scaling, ScaleKind.FP32
    raise ValueError(f"scaling must be None, 'tensor' or a (rows, cols) block, got {scaling!r}")


def _checked_subset(values: Iterable[str], allowed: tuple[str, ...], what: str) -> tuple[str, ...]:
    values = tuple(values)
    unknown = [v for v in values if v not in allowed]
    if unknown or not values:
        raise ValueError(f"{what} must be a non-empty subset of {allowed}, got {values}")
    return tuple(v for v in allowed if v in values)  # canonical order, so equal selections hash equally


@dataclass(frozen=True)
class Scheme:
    """One simulated precision: element format, rounding, scaling, operands and GEMMs."""

    element: ElementFormat
    rounding: Rounding = Rounding.RNE
    scaling: Scaling = None
    operands: tuple[str, ...] = OPERANDS
    gemms: tuple[str, ...] = GEMMS

    def __post_init__(self):
        object.__setattr__(self, "element", element_format(self.element))
        object.__setattr__(self, "rounding", Rounding(self.rounding))
        _scale_of(self.scaling)
        object.__setattr__(self, "operands", _checked_subset(self.operands, OPERANDS, "operands"))
        object.__setattr__(self, "gemms", _checked_subset(self.gemms, GEMMS, "gemms"))

    def spec(self) -> QuantSpec:
        block, scale = _scale_of(self.scaling)
        return QuantSpec(self.element, block, scale, self.rounding)

    def precision(self) -> LinearPrecision:
        spec = self.spec()
        simulated = GemmRecipe(
            self.label,
            act=spec if "act" in self.operands else None,
            weight=spec if "weight" in self.operands else None,
            grad=spec if "grad" in self.operands else None,
        )
        # A GEMM none of whose operands is simulated is plain (high precision).
        untouched = GemmRecipe("bf16")
        return LinearPrecision(*(simulated if g in self.gemms else untouched for g in GEMMS))

    @property
    def label(self) -> str:
        """The text form (see the module docstring); `parse_scheme(s.label) == s`."""
        # By widths, so the bf16 layout reads "e8m7" (in snip "bf16" means "not quantized").
        name = self.element.name
        parts = [name if name.startswith("e") else f"e{self.element.exp_bits}m{self.element.man_bits}"]
        if self.rounding != Rounding.RNE:
            parts.append(self.rounding.value)
        if self.scaling == "tensor":
            parts.append("tensor")
        elif self.scaling is not None:
            parts.append(f"{self.scaling[0]}x{self.scaling[1]}")
        if self.operands != OPERANDS:
            parts.append("ops=" + "+".join(self.operands))
        if self.gemms != GEMMS:
            parts.append("gemms=" + "+".join(self.gemms))
        return ":".join(parts)

    def __str__(self) -> str:
        return self.label


def exmy_precision(
    exp_bits: int,
    man_bits: int,
    rounding: Rounding | str = Rounding.RNE,
    operands: Iterable[str] = OPERANDS,
    gemms: Iterable[str] = GEMMS,
    scaling: Scaling = None,
) -> LinearPrecision:
    """The `LinearPrecision` that simulates E<exp_bits>M<man_bits> on `operands` of `gemms`.

    The element is `snip_ops.formats.exmy(exp_bits, man_bits)`: a named format where the widths match
    one (E8M7 -> bf16 layout, E5M2, and the IEEE-style rest), otherwise a generic IEEE-style eXmY. For
    the OCP encodings (E4M3 without Inf, E3M2/E2M1 without NaN) use `Scheme(element_format("e4m3"))`
    or `parse_scheme("e4m3")`, which go by name.
    """
    return Scheme(exmy(exp_bits, man_bits), Rounding(rounding), scaling, tuple(operands), tuple(gemms)).precision()


def paper_scheme(
    exp_bits: int, man_bits: int, operands: Iterable[str] = OPERANDS, gemms: Iterable[str] = GEMMS
) -> Scheme:
    """E<exp_bits>M<man_bits> simulated as the stability paper does: masking, exponent range clipped, no
    scaling (module docstring). The element is the IEEE-style `exmy(exp_bits, man_bits)`: its top
    exponent is kept for Inf/NaN, so E8 formats have exactly FP32's (and BF16's) range."""
    return Scheme(exmy(exp_bits, man_bits), PAPER_ROUNDING, PAPER_SCALING, tuple(operands), tuple(gemms))


def _parse_block(text: str) -> tuple[int, int] | None:
    rows, sep, cols = text.partition("x")
    if sep and rows.isdigit() and cols.isdigit():
        return int(rows), int(cols)
    return None


def parse_scheme(text: str) -> Scheme:
    """A `Scheme` from its text form, e.g. "e8m3", "e4m3:sr:tensor", "e5m2:ops=grad:gemms=dgrad+wgrad",
    "e7m2:paper" (the stability paper's method: `paper_scheme`; it cannot be combined with a rounding or
    scaling option).

    The element goes by name (`snip_ops.formats.element_format`): "e4m3" is the OCP E4M3 (no Inf),
    "e2m1"/"e3m2" the OCP MX elements, "e8m7" the bf16 layout, any other "eXmY" IEEE-style.
    """
    head, *options = text.strip().lower().split(":")
    roundings = {r.value for r in Rounding}
    numerics = [o for o in options if o in roundings or o in ("tensor", "paper") or _parse_block(o) is not None]
    if "paper" in options and len(numerics) > 1:
        raise ValueError(f"'paper' sets the rounding and the scaling; scheme {text!r} sets them again")
    kwargs: dict = {}
    for opt in options:
        if opt == "paper":
            kwargs.update(rounding=PAPER_ROUNDING, scaling=PAPER_SCALING)
        elif opt in roundings:
            kwargs["rounding"] = Rounding(opt)
        elif opt == "tensor":
            kwargs["scaling"] = "tensor"
        elif _parse_block(opt) is not None:
            kwargs["scaling"] = _parse_block(opt)
        elif opt.startswith("ops="):
            kwargs["operands"] = tuple(opt[4:].split("+"))
        elif opt.startswith("gemms="):
            kwargs["gemms"] = tuple(opt[6:].split("+"))
        else:
            raise ValueError(
                f"cannot parse option {opt!r} of scheme {text!r}; expected a rounding (rne/sr/trunc), "
                f"'tensor', a block 'RxC', 'paper', 'ops=act+weight+grad' or 'gemms=fprop+dgrad+wgrad'"
            )
    return Scheme(element_format(head), **kwargs)
