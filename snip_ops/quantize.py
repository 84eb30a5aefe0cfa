"""`snip_ops.quantize`: the CUDA kernel where one exists for the spec and device, the reference
otherwise. Both give bit-identical results (tests/test_quant_kernels_gpu.py checks it)."""

from __future__ import annotations

import torch

from . import _ext, reference
from .formats import E4M3, QuantSpec, Rounding, ScaleKind
from .reference import QTensor

__all__ = ["quantize"]


def _fp8_rowwise_kernel(x: torch.Tensor, spec: QuantSpec, transpose: bool, tensor_amax) -> bool:
    return (
        spec.element == E4M3 and spec.block == (1, 128) and spec.rounding == Rounding.RNE
        and spec.scale in (ScaleKind.FP32, ScaleKind.POW2) and not transpose and tensor_amax is None
        and x.is_contiguous() and _ext.kernel_available("fp8_quantize_1x128", x.device)
    )


def quantize(
    x: torch.Tensor,
    spec: QuantSpec,
    *,
    seed: int = 0,
    offset: int = 0,
    transpose: bool = False,
    tensor_amax=None,
    checked: bool = False,
) -> QTensor:
    """Quantize a 2-D tensor; see `reference.quantize` for the exact semantics and arguments."""
    reference.check_input(x)
    if isinstance(spec, QuantSpec) and _fp8_rowwise_kernel(x, spec, transpose, tensor_amax):
        if checked and not bool(torch.isfinite(x).all()):
            raise ValueError("quantize: input contains NaN or Inf (checked mode)")
        codes, scales = torch.ops.snip_C.fp8_quantize_1x128(x, spec.scale == ScaleKind.POW2)
        return QTensor(codes, scales, spec, tuple(x.shape))
    return reference.quantize(
        x, spec, seed=seed, offset=offset, transpose=transpose, tensor_amax=tensor_amax, checked=checked
    )
