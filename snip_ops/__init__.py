"""snip_ops: low-precision (FP8 / FP4) linear layers for training, with exact PyTorch references.

Public surface (docs/design.md §7): `linear`, `SnipLinear`, `convert`, `quantize` / `dequantize` /
`fake_quantize` and their `QTensor`, the recipe types of `formats`, `build_info`, `self_check` (kernels are
used after a self-check on each device), `reuse_quantized_weights` (one weight quantization per step under
gradient accumulation); `snip_ops.fsdp` and `snip_ops.tensor_parallel` for sharded training.
"""

from . import _ext, self_check

# Kernels earn their use: each compiled kernel runs on a device only after its self-check passed there. Installed
# before anything else of the package is imported, so before any kernel can run.
_ext.set_kernel_gate(self_check.passed)

from . import formats
from ._ext import build_info
from .formats import GemmRecipe, LinearPrecision, QuantSpec, Rounding, ScaleKind, recipe
from .linear import linear
from .module import SnipLinear, convert
from .reference import QTensor, fake_quantize
from .quantize import dequantize, quantize
from .weight_reuse import reuse_quantized_weights

__all__ = [
    "formats", "self_check", "build_info", "GemmRecipe", "LinearPrecision", "QuantSpec", "Rounding", "ScaleKind", "recipe",
    "linear", "SnipLinear", "convert", "QTensor", "quantize", "dequantize", "fake_quantize",
    "reuse_quantized_weights",
]


def __getattr__(name: str):
    # snip_ops.fsdp imports torch's FSDP, about a second of every `import snip_ops`: loaded at first use
    if name == "fsdp":
        import importlib

        return importlib.import_module(".fsdp", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
