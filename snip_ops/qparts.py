"""A `QTensor` as the three plain tensors that can cross a custom op's boundary, and their shapes
without data (for fake implementations under torch.compile).

Parts: `codes`, then `scales` unless the format is unscaled, then the 0-d float32 tensor scale of
nvfp4 (`num_parts`). The shapes and dtypes are those of `reference.quantize` -- and of the CUDA
quantizer, which produces the same layout -- with the scales in the given scale layout
(`reference.QTensor.scale_layout`).
"""

from __future__ import annotations

import torch

from .formats import QuantSpec, ScaleKind
from .reference import _TORCH_CODE_DTYPES, QTensor, block_shape
from .scale_layout import blackwell_shape, hopper_shape

__all__ = ["to_parts", "from_parts", "meta_parts", "num_parts"]

_SCALE_DTYPES = {ScaleKind.FP32: torch.float32, ScaleKind.POW2: torch.float32,
                 ScaleKind.E8M0: torch.float8_e8m0fnu, ScaleKind.NVFP4: torch.float8_e4m3fn}


def num_parts(spec: QuantSpec) -> int:
    """codes, then scales unless the format is unscaled, then the nvfp4 tensor scale."""
    return 1 + (spec.scale != ScaleKind.NONE) + (spec.scale == ScaleKind.NVFP4)


def to_parts(q: QTensor) -> list[torch.Tensor]:
    """Contiguous parts (the fake shapes promise contiguous strides; a transposed quantization
    may produce transposed views)."""
    parts = [q.codes.contiguous()]
    if q.spec.scale != ScaleKind.NONE:
        parts.append(q.scales.contiguous())
    if q.spec.scale == ScaleKind.NVFP4:
        parts.append(q.tensor_scale.reshape(()).clone())
    return parts


def from_parts(parts: list[torch.Tensor], spec: QuantSpec, shape: tuple[int, int],
               scale_layout: str = "plain") -> QTensor:
    scales = parts[1] if spec.scale != ScaleKind.NONE else None
    ts = parts[2] if spec.scale == ScaleKind.NVFP4 else None
    return QTensor(parts[0], scales, spec, tuple(shape), ts, scale_layout)


def meta_parts(spec: QuantSpec, shape: tuple[int, int], like: torch.Tensor,
               scale_layout: str = "plain") -> list[torch.Tensor]:
    """Empty tensors with the shapes and dtypes of
    `to_parts(quantize(x [shape], spec, scale_layout=scale_layout))`."""
    rows, cols = shape
    bits = spec.element.bits
    if bits == 4:
        parts = [like.new_empty(rows, (cols + 1) // 2, dtype=torch.uint8)]
    elif bits <= 8:
        parts = [like.new_empty(rows, cols, dtype=_TORCH_CODE_DTYPES.get(spec.element.name, torch.uint8))]
    else:
        parts = [like.new_empty(rows, cols, dtype=torch.int32)]
    if spec.scale != ScaleKind.NONE:
        br, bc = block_shape(spec, shape)
        grid = (-(-rows // br), -(-cols // bc))
        if scale_layout == "blackwell":
            grid = blackwell_shape(*grid)
        elif scale_layout == "hopper":
            grid = hopper_shape(*grid)
        parts.append(like.new_empty(*grid, dtype=_SCALE_DTYPES[spec.scale]))
    if spec.scale == ScaleKind.NVFP4:
        parts.append(like.new_empty((), dtype=torch.float32))
    return parts
