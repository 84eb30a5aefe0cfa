"""snip_ops: low-precision (FP8 / FP4) linear layers for training, with exact PyTorch references.

Public surface (DESIGN.md §7): `linear`, `SnipLinear`, `convert`, `quantize` / `dequantize`,
`formats`, `build_info`, `self_check` (kernels are used after a self-check on each device).
"""

from . import formats, fsdp, self_check
from ._ext import build_info
from .formats import GemmRecipe, LinearPrecision, QuantSpec, Rounding, ScaleKind, recipe
from .linear import linear
from .module import SnipLinear, convert
from .reference import QTensor, fake_quantize
from .quantize import dequantize, quantize

__all__ = [
    "formats", "self_check", "build_info", "GemmRecipe", "LinearPrecision", "QuantSpec", "Rounding", "ScaleKind", "recipe",
    "linear", "SnipLinear", "convert", "QTensor", "quantize", "dequantize", "fake_quantize",
]
