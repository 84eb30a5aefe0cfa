"""Number formats, scaling recipes and per-GEMM precisions.

Everything here is a frozen dataclass or an enum: a format is a value, never configured
through global state. Three levels:

* `ElementFormat` -- how one element is encoded (E4M3, E5M2, E2M1, any eXmY).
* `QuantSpec`     -- how a 2-D tensor is quantized: element format, block shape, scale kind,
                     rounding mode.
* `GemmRecipe`    -- the QuantSpecs of the operands of one GEMM (activation, weight, gradient);
  `LinearPrecision` -- one recipe for each of a linear layer's three GEMMs (fprop, dgrad, wgrad).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Literal, Mapping

__all__ = [
    "ElementFormat", "E4M3", "E5M2", "E2M1", "E3M2", "E2M3", "BF16", "FP16", "FP32", "exmy",
    "element_format", "Rounding", "ScaleKind", "QuantSpec", "GemmRecipe", "RECIPES", "recipe", "LinearPrecision",
    "GEMMS", "gemm_dims",
]

Special = Literal["ieee", "fn", "none"]


@dataclass(frozen=True)
class ElementFormat:
    """A sign + `exp_bits` exponent + `man_bits` mantissa floating-point element.

    `special` says how the top of the encoding space is used:
      * "ieee": the all-ones exponent holds Inf/NaN (E5M2, BF16, FP16, FP32, generic eXmY);
      * "fn":   only the all-ones pattern is NaN, no Inf (E4M3 as in OCP FP8 / torch.float8_e4m3fn);
      * "none": every pattern is a finite number (E2M1, E3M2, E2M3 of OCP MX).
    """

    name: str
    exp_bits: int
    man_bits: int
    special: Special = "ieee"

    def __post_init__(self):
        if not 1 <= self.exp_bits <= 8:
            raise ValueError(f"{self.name}: exponent bits must be in 1..8, got {self.exp_bits}")
        if not 0 <= self.man_bits <= 23:
            raise ValueError(f"{self.name}: mantissa bits must be in 0..23, got {self.man_bits}")
        if self.special not in ("ieee", "fn", "none"):
            raise ValueError(f"{self.name}: special must be 'ieee', 'fn' or 'none', got {self.special!r}")
        if self.special == "ieee" and self.exp_bits < 2:
            raise ValueError(f"{self.name}: an IEEE-style format needs at least 2 exponent bits")
        if self.special == "fn" and self.man_bits == 0 and self.exp_bits < 2:
            raise ValueError(f"{self.name}: 'fn' needs room for a NaN pattern")

    @property
    def bits(self) -> int:
        return 1 + self.exp_bits + self.man_bits

    @property
    def bias(self) -> int:
        return (1 << (self.exp_bits - 1)) - 1

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        top = (1 << self.exp_bits) - 1
        return (top - 1 if self.special == "ieee" else top) - self.bias

    @property
    def max_finite(self) -> float:
        m = self.man_bits
        if self.special == "fn":
            # The all-ones pattern at the top exponent is NaN: the largest finite value is one ulp below.
            if m == 0:
                return 2.0 ** (self.emax - 1)
            return (2.0 - 2.0 ** (1 - m)) * 2.0 ** self.emax
        return (2.0 - 2.0 ** (-m)) * 2.0 ** self.emax

    @property
    def min_normal(self) -> float:
        return 2.0 ** self.emin

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.man_bits)

    @property
    def has_nan(self) -> bool:
        return self.special != "none"

    @property
    def has_inf(self) -> bool:
        return self.special == "ieee"

    def __repr__(self) -> str:
        return f"ElementFormat({self.name})"


E4M3 = ElementFormat("e4m3", 4, 3, "fn")
E5M2 = ElementFormat("e5m2", 5, 2, "ieee")
E2M1 = ElementFormat("e2m1", 2, 1, "none")
E3M2 = ElementFormat("e3m2", 3, 2, "none")
E2M3 = ElementFormat("e2m3", 2, 3, "none")
BF16 = ElementFormat("bf16", 8, 7, "ieee")
FP16 = ElementFormat("fp16", 5, 10, "ieee")
FP32 = ElementFormat("fp32", 8, 23, "ieee")

_ELEMENTS = {f.name: f for f in (E4M3, E5M2, E2M1, E3M2, E2M3, BF16, FP16, FP32)}


def exmy(exp_bits: int, man_bits: int, special: Special = "ieee") -> ElementFormat:
    """A format with any exponent/mantissa width (E8M7 is the BF16 layout), for simulation.

    A width/special combination that matches a named format returns that format; other IEEE-style
    ones are named "eXmY", the rest "eXmY_<special>".
    """
    for known in _ELEMENTS.values():
        if (known.exp_bits, known.man_bits, known.special) == (exp_bits, man_bits, special):
            return known
    name = f"e{exp_bits}m{man_bits}"
    if special != "ieee" or name in _ELEMENTS:
        name = f"{name}_{special}"
    return ElementFormat(name, exp_bits, man_bits, special)


def element_format(name: str | ElementFormat) -> ElementFormat:
    """A named element format ("e4m3", "e2m1", "bf16", ...) or a simulated "eXmY[_special]"."""
    if isinstance(name, ElementFormat):
        return name
    if name in _ELEMENTS:
        return _ELEMENTS[name]
    body, _, special = name.lower().partition("_")
    if body.startswith("e") and "m" in body:
        e, m = body[1:].split("m", 1)
        if e.isdigit() and m.isdigit():
            return exmy(int(e), int(m), special or "ieee")
    raise ValueError(f"unknown element format {name!r}; known: {sorted(_ELEMENTS)} or 'eXmY[_ieee|_fn|_none]'")


class Rounding(str, enum.Enum):
    """How a scaled FP32 value becomes an element of the target format."""

    RNE = "rne"      # round to nearest, ties to even
    SR = "sr"        # stochastic: Philox4x32-10 bits keyed by (seed, offset), see philox.py
    TRUNC = "trunc"  # toward zero (bit masking), for bit-reduction studies


class ScaleKind(str, enum.Enum):
    """How a block's scale is chosen and stored."""

    NONE = "none"    # no scaling at all (eXmY simulation on raw values)
    FP32 = "fp32"    # amax / max_finite, stored as float32
    POW2 = "pow2"    # amax / max_finite rounded up to a power of two, stored as float32
    E8M0 = "e8m0"    # power of two (rounded up) stored as an E8M0 byte (OCP MX)
    NVFP4 = "nvfp4"  # E4M3 block scale times one FP32 scale per tensor


@dataclass(frozen=True)
class QuantSpec:
    """How to quantize a 2-D tensor [rows, cols] whose reduction dimension is `cols`.

    `block` is (rows, cols) of one scaling block; 0 means the whole dimension, so (1, 0) is
    row-wise and (0, 0) tensor-wise scaling. Shapes that are not multiples of the block are
    zero-padded internally.
    """

    element: ElementFormat
    block: tuple[int, int] = (1, 128)
    scale: ScaleKind = ScaleKind.FP32
    rounding: Rounding = Rounding.RNE

    def __post_init__(self):
        if not isinstance(self.element, ElementFormat):
            raise TypeError(f"element must be an ElementFormat, got {type(self.element).__name__}")
        br, bc = self.block
        if br < 0 or bc < 0:
            raise ValueError(f"block sizes must be >= 0 (0 = whole dimension), got {self.block}")
        object.__setattr__(self, "scale", ScaleKind(self.scale))
        object.__setattr__(self, "rounding", Rounding(self.rounding))
        if self.scale == ScaleKind.NVFP4 and self.element != E2M1:
            raise ValueError("nvfp4 scaling is defined for E2M1 elements only")
        # Made once: every quantization and GEMM call passes the spec to its op as this string.
        object.__setattr__(self, "_text", f"{self.element.name}/{br}x{bc}/{self.scale.value}/{self.rounding.value}")

    def __hash__(self) -> int:
        # Specs key the kernel decisions kept per call signature (_ext.GateMemo); the text names every field
        # (`parse` inverts it), so equal specs hash alike, without hashing the fields on every lookup.
        return hash(self._text)

    @property
    def packed(self) -> bool:
        """Codes are stored two per byte (4-bit formats)."""
        return self.element.bits == 4

    def with_rounding(self, rounding: Rounding | str) -> "QuantSpec":
        return replace(self, rounding=Rounding(rounding))

    def describe(self) -> str:
        """A compact string, e.g. "e4m3/1x128/fp32/rne" (0 in a block means the whole dimension)."""
        return self._text

    @classmethod
    def parse(cls, text: str) -> "QuantSpec":
        """The inverse of `describe`."""
        try:
            elem, blk, scale, rounding = text.split("/")
            br, bc = (int(v) for v in blk.split("x"))
        except ValueError:
            raise ValueError(f"cannot parse quantization spec {text!r}; expected e.g. 'e4m3/1x128/fp32/rne'") from None
        return cls(element_format(elem), (br, bc), ScaleKind(scale), Rounding(rounding))


GEMMS = ("fprop", "dgrad", "wgrad")


def gemm_dims(gemm: str, M: int, N: int, K: int) -> tuple[int, int, int]:
    """(m, n, k) of a linear layer's GEMM, k the reduced dimension, for M tokens, N outputs, K inputs:
    fprop y = x w^T (M, N, K), dgrad dx = dy w (M, K, N), wgrad dw = dy^T x (N, K, M)."""
    if gemm not in GEMMS:
        raise ValueError(f"unknown GEMM {gemm!r}; expected one of {GEMMS}")
    return {"fprop": (M, N, K), "dgrad": (M, K, N), "wgrad": (N, K, M)}[gemm]


@dataclass(frozen=True)
class GemmRecipe:
    """The operand formats of one GEMM of a linear layer (docs/design.md §3).

    `act` quantizes activations (x in fprop, x^T in wgrad), `weight` the weight (w in fprop, w^T in
    dgrad), `grad` the output gradient (dy in dgrad, dy^T in wgrad). None everywhere means BF16.
    `speedup` is the GEMM throughput factor over BF16 used by the planner's theoretical cost
    (bf16 1, fp8 2, fp4 4). `wgrad_hadamard` > 0: where this recipe runs a wgrad GEMM, both of its
    operands first go through a random Hadamard transform of that size along the token dimension
    (snip_ops/hadamard.py; NVIDIA's NVFP4 training recipe); fprop and dgrad are unaffected.
    """

    name: str
    act: QuantSpec | None = None
    weight: QuantSpec | None = None
    grad: QuantSpec | None = None
    speedup: float = 1.0
    wgrad_hadamard: int = 0

    def __post_init__(self):
        h = self.wgrad_hadamard
        if not isinstance(h, int) or h < 0 or (h and (h < 2 or h & (h - 1))):
            raise ValueError(f"{self.name}: wgrad_hadamard must be 0 (off) or a power of two >= 2, got {h!r}")
        if h and (self.act is None or self.grad is None):
            raise ValueError(f"{self.name}: a Hadamard-transformed wgrad needs quantized activations and gradients")
        parts = [self.name, str(self.speedup)]
        parts += ["-" if s is None else s.describe() for s in (self.act, self.weight, self.grad)]
        if h:
            parts.append(f"rht{h}")
        # Made once: a linear layer passes it to its ops on every call.
        object.__setattr__(self, "_key", ";".join(parts))

    @property
    def is_bf16(self) -> bool:
        return self.act is None and self.weight is None and self.grad is None

    def key(self) -> str:
        """A string that identifies the recipe completely, so it can cross a torch custom-op boundary."""
        return self._key

    @classmethod
    def from_key(cls, key: str) -> "GemmRecipe":
        name, speedup, *specs = key.split(";")
        hadamard = 0
        if len(specs) == 4 and specs[3].startswith("rht") and specs[3][3:].isdigit():
            hadamard = int(specs.pop()[3:])
        if len(specs) != 3:
            raise ValueError(f"malformed recipe key {key!r}")
        act, weight, grad = (None if s == "-" else QuantSpec.parse(s) for s in specs)
        return cls(name, act, weight, grad, float(speedup), hadamard)


def _fp8(grad_elem: ElementFormat = E4M3) -> GemmRecipe:
    return GemmRecipe(
        "fp8" if grad_elem == E4M3 else f"fp8_{grad_elem.name}grad",
        act=QuantSpec(E4M3, (1, 128), ScaleKind.FP32),
        weight=QuantSpec(E4M3, (128, 128), ScaleKind.FP32),
        grad=QuantSpec(grad_elem, (1, 128), ScaleKind.FP32),
        speedup=2.0,
    )


def _mx(name: str, elem: ElementFormat, block: int, scale: ScaleKind, speedup: float, grad_sr: bool) -> GemmRecipe:
    grad_round = Rounding.SR if grad_sr else Rounding.RNE
    return GemmRecipe(
        name,
        act=QuantSpec(elem, (1, block), scale),
        weight=QuantSpec(elem, (1, block), scale),
        grad=QuantSpec(elem, (1, block), scale, grad_round),
        speedup=speedup,
    )


RECIPES: Mapping[str, GemmRecipe] = {
    "bf16": GemmRecipe("bf16"),
    "fp8": _fp8(E4M3),
    "fp8_e5m2grad": _fp8(E5M2),
    "mxfp8": _mx("mxfp8", E4M3, 32, ScaleKind.E8M0, 2.0, grad_sr=False),
    "nvfp4": _mx("nvfp4", E2M1, 16, ScaleKind.NVFP4, 4.0, grad_sr=True),
    "mxfp4": _mx("mxfp4", E2M1, 32, ScaleKind.E8M0, 4.0, grad_sr=True),
    # NVIDIA's NVFP4 pretraining recipe (Transformer Engine's NVFP4BlockScaling): 16x16 weight blocks,
    # so that w and w^T share scales and the weight is quantized once per step; gradients rounded
    # stochastically; a 16-point random Hadamard transform on both wgrad operands; RNE elsewhere.
    "nvfp4_train": GemmRecipe(
        "nvfp4_train",
        act=QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4),
        weight=QuantSpec(E2M1, (16, 16), ScaleKind.NVFP4),
        grad=QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR),
        speedup=4.0,
        wgrad_hadamard=16,
    ),
    # The SNIP paper's FP4: E2M1 with the FP8 recipe's granularity; gradients rounded stochastically.
    "fp4": GemmRecipe(
        "fp4",
        act=QuantSpec(E2M1, (1, 128), ScaleKind.FP32),
        weight=QuantSpec(E2M1, (128, 128), ScaleKind.FP32),
        grad=QuantSpec(E2M1, (1, 128), ScaleKind.FP32, Rounding.SR),
        speedup=4.0,
    ),
}


def recipe(name: str | GemmRecipe) -> GemmRecipe:
    """Look up a named GEMM recipe ("bf16", "fp8", "fp8_e5m2grad", "mxfp8", "nvfp4", "nvfp4_train", "mxfp4",
    "fp4")."""
    if isinstance(name, GemmRecipe):
        return name
    if not isinstance(name, str):
        raise TypeError(f"a precision is a recipe name or a GemmRecipe, got {type(name).__name__}")
    try:
        return RECIPES[name]
    except KeyError:
        raise ValueError(f"unknown precision {name!r}; known: {', '.join(RECIPES)}") from None


@dataclass(frozen=True)
class LinearPrecision:
    """One recipe for each GEMM of a linear layer: fprop (y = x w^T), dgrad (dx = dy w), wgrad (dw = dy^T x).

    Accepts recipe names: `LinearPrecision("fp8")` uses fp8 everywhere,
    `LinearPrecision(fprop="fp8", dgrad="fp4", wgrad="fp4")` mixes them.
    """

    fprop: GemmRecipe | str = "bf16"
    dgrad: GemmRecipe | str | None = None
    wgrad: GemmRecipe | str | None = None

    def __post_init__(self):
        fprop = recipe(self.fprop)
        object.__setattr__(self, "fprop", fprop)
        object.__setattr__(self, "dgrad", fprop if self.dgrad is None else recipe(self.dgrad))
        object.__setattr__(self, "wgrad", fprop if self.wgrad is None else recipe(self.wgrad))

    @classmethod
    def of(cls, value: "LinearPrecision | GemmRecipe | str | Mapping[str, str] | None") -> "LinearPrecision":
        """Normalise a user-facing precision: None (bf16), a name, a recipe, a mapping or a LinearPrecision."""
        if value is None:
            return cls("bf16")
        if isinstance(value, LinearPrecision):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - set(GEMMS)
            if unknown:
                raise ValueError(f"unknown GEMM names {sorted(unknown)}; expected a subset of {GEMMS}")
            return cls(value.get("fprop", "bf16"), value.get("dgrad", "bf16"), value.get("wgrad", "bf16"))
        return cls(value)

    @property
    def is_bf16(self) -> bool:
        return all(r.is_bf16 for r in (self.fprop, self.dgrad, self.wgrad))

    def gemm(self, name: str) -> GemmRecipe:
        if name not in GEMMS:
            raise ValueError(f"unknown GEMM {name!r}; expected one of {GEMMS}")
        return getattr(self, name)

    def to_json(self) -> dict[str, str] | str:
        names = {g: self.gemm(g).name for g in GEMMS}
        if len(set(names.values())) == 1 and all(self.gemm(g) == recipe(names[g]) for g in GEMMS if names[g] in RECIPES):
            return names["fprop"]
        return names

    @classmethod
    def from_json(cls, value) -> "LinearPrecision":
        return cls.of(value)

    def __str__(self) -> str:
        j = self.to_json()
        return j if isinstance(j, str) else "/".join(j[g] for g in GEMMS)
