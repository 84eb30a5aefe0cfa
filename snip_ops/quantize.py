"""`snip_ops.quantize` and friends: the native ops (snip_C::quantize / snip_C::dequantize: the CUDA
kernels, or on the CPU their host implementation) where they exist for the spec and the device, the
PyTorch reference otherwise. All give bit-identical results (tests/ops/test_quant_kernels_gpu.py
checks the kernels on a GPU, tests/ops/test_quantize_cpu_op.py the CPU implementation).

Kernel-backed specs (`kernel_supports`): elements E4M3, E5M2, E2M1; blocks 1x16, 1x32, 1x128,
16x16, 128x128; scales FP32, POW2, E8M0, NVFP4 (E2M1 only); rounding RNE and SR. Everything else
(TRUNC rounding, eXmY simulation formats, tensor-/row-wise blocks, ScaleKind.NONE) runs on the
reference, as does every tensor on a device without the ops (a pure-Python install).

Input layout: any row stride is read in place; a tensor whose last dimension is not unit-stride
(e.g. a transposed view) is first copied with `.contiguous()` (one extra pass; to quantize x^T of
a contiguous x, pass x with `transpose=True` instead, which is fused).

The kernels take seed and offset as host integers (int64 op arguments, bit-reinterpreted from
[0, 2^64)). A CUDA graph would replay them, so a quantization that draws random bits refuses to
run while one is captured (`philox.refuse_capture`); a graph-safe variant would read the offset
from a device tensor instead.
"""

from __future__ import annotations

import torch

from . import _ext, philox, reference
from .formats import E2M1, E4M3, E5M2, QuantSpec, Rounding, ScaleKind
from .hadamard import HADAMARD_SIZE, padded_tokens, random_hadamard, sign_mask
from .reference import QTensor
from .scale_layout import to_layout

__all__ = ["quantize", "quantize_rowcol", "quantize_hadamard_t", "dequantize", "fake_quantize", "kernel_supports"]

_KERNEL_ELEMENTS = (E4M3, E5M2, E2M1)
_KERNEL_BLOCKS = ((1, 16), (1, 32), (1, 128), (16, 16), (128, 128))
_KERNEL_SCALES = (ScaleKind.FP32, ScaleKind.POW2, ScaleKind.E8M0, ScaleKind.NVFP4)
_MASK64 = (1 << 64) - 1


def kernel_supports(spec: QuantSpec) -> bool:
    """True when snip_C::quantize / dequantize implement `spec` (on every device they are built for)."""
    return (
        isinstance(spec, QuantSpec)
        and spec.element in _KERNEL_ELEMENTS
        and spec.block in _KERNEL_BLOCKS
        and spec.scale in _KERNEL_SCALES
        and spec.rounding in (Rounding.RNE, Rounding.SR)
    )


def _use_kernel(t: torch.Tensor, spec: QuantSpec, op: str = "quantize") -> bool:
    return kernel_supports(spec) and _ext.kernel_available(op, t.device)


def _refuse_capture_sr(x: torch.Tensor, spec: QuantSpec) -> None:
    if getattr(spec, "rounding", None) == Rounding.SR:
        philox.refuse_capture(x, f"quantizing to {spec.describe()} with stochastic rounding")


def _int64(v: int) -> int:
    """A uint64 seed/offset as the signed int64 a torch op argument carries (same bits)."""
    v &= _MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


def _kernel_quantize(x, spec, seed, offset, offset_t, rowwise, colwise, tensor_amax, checked, scale_layout,
                     hadamard_signs=-1):
    if checked and not bool(torch.isfinite(x).all()):
        raise ValueError("quantize: input contains NaN or Inf (checked mode)")
    if spec.scale != ScaleKind.NVFP4 and tensor_amax is not None:
        raise ValueError("tensor_amax is only used by nvfp4 scaling")
    if spec.rounding == Rounding.SR:
        philox._check_seed_offset(seed, offset)
        philox._check_seed_offset(seed, offset_t)
    if x.dim() == 2 and x.stride(1) != 1 and x.shape[1] > 1:
        x = x.contiguous()
    if tensor_amax is not None:
        tensor_amax = torch.as_tensor(tensor_amax, dtype=torch.float32, device=x.device)
    codes, scales, codes_t, scales_t, ts = torch.ops.snip_C.quantize(
        x, spec.describe(), rowwise, colwise, _int64(seed), _int64(offset), _int64(offset_t), tensor_amax,
        scale_layout, 1, hadamard_signs
    )
    ts = ts if spec.scale == ScaleKind.NVFP4 else None
    rows, cols = x.shape
    rows_t = padded_tokens(rows) if hadamard_signs >= 0 else rows  # T x has x's rows padded to whole groups
    row = QTensor(codes, scales, spec, (rows, cols), ts, scale_layout) if rowwise else None
    col = QTensor(codes_t, scales_t, spec, (cols, rows_t), ts, scale_layout) if colwise else None
    return row, col


def _in_layout(q: QTensor, scale_layout: str) -> QTensor:
    """A reference QTensor (plain scales) with its scales moved to `scale_layout` (an exact permutation)."""
    if scale_layout == "plain":
        return q
    return QTensor(q.codes, to_layout(q.scales, scale_layout), q.spec, q.shape, q.tensor_scale, scale_layout)


def quantize(
    x: torch.Tensor,
    spec: QuantSpec,
    *,
    seed: int = 0,
    offset: int = 0,
    transpose: bool = False,
    tensor_amax=None,
    checked: bool = False,
    scale_layout: str = "plain",
) -> QTensor:
    """Quantize a 2-D tensor; see `reference.quantize` for the exact semantics and arguments.
    `scale_layout` "blackwell" / "hopper" writes the scales as the Blackwell block-scaled / Hopper blockwise
    GEMMs read them (`reference.QTensor`), so that the GEMM needs no relayout."""
    reference.check_input(x)
    reference.check_scale_layout(spec, scale_layout)
    _refuse_capture_sr(x, spec)
    if _use_kernel(x, spec):
        row, col = _kernel_quantize(x, spec, seed, offset, offset, not transpose, transpose, tensor_amax, checked,
                                    scale_layout)
        return col if transpose else row
    q = reference.quantize(
        x, spec, seed=seed, offset=offset, transpose=transpose, tensor_amax=tensor_amax, checked=checked
    )
    return _in_layout(q, scale_layout)


def quantize_rowcol(
    x: torch.Tensor,
    spec: QuantSpec,
    *,
    seed: int = 0,
    offset: int = 0,
    offset_t: int | None = None,
    rowwise: bool = True,
    colwise: bool = True,
    tensor_amax=None,
    checked: bool = False,
    scale_layout: str = "plain",
) -> tuple[QTensor | None, QTensor | None]:
    """`(quantize(x, ..., offset=offset), quantize(x, ..., offset=offset_t, transpose=True))` in one
    pass over x on the GPU (docs/design.md §3: x for fprop and x^T for wgrad; dy and dy^T; w and w^T).

    `offset_t` (default: `offset`) keys the SR bits of the transposed output; either output can be
    switched off (None is returned in its place). With 2-D blocks both outputs share their scales.
    `scale_layout` applies to both outputs (see `quantize`).
    """
    reference.check_input(x)
    reference.check_scale_layout(spec, scale_layout)
    if not (rowwise or colwise):
        raise ValueError("quantize_rowcol: request rowwise and/or colwise outputs")
    _refuse_capture_sr(x, spec)
    offset_t = offset if offset_t is None else offset_t
    if _use_kernel(x, spec):
        return _kernel_quantize(x, spec, seed, offset, offset_t, rowwise, colwise, tensor_amax, checked, scale_layout)
    kw = dict(seed=seed, tensor_amax=tensor_amax, checked=checked)
    row = _in_layout(reference.quantize(x, spec, offset=offset, **kw), scale_layout) if rowwise else None
    col = _in_layout(reference.quantize(x, spec, offset=offset_t, transpose=True, **kw), scale_layout) if colwise else None
    return row, col


def quantize_hadamard_t(x: torch.Tensor, spec: QuantSpec, signs: torch.Tensor, *, seed: int = 0, offset: int = 0,
                        scale_layout: str = "plain") -> QTensor:
    """`quantize(random_hadamard(x, signs), spec, transpose=True, ...)`: (T x)^T, the wgrad operand of a
    recipe with a random Hadamard transform (hadamard.py), bit for bit. With 1x16 blocks and the 16
    signs the native quantizer does it in one op: on a GPU the transform runs inside the column pass
    (and the NVFP4 tensor-amax pass), with no T x in memory; on the CPU its host implementation. That
    covers FP4 elements (the transform exists for NVFP4 training); other elements quantize T x."""
    reference.check_input(x)
    reference.check_scale_layout(spec, scale_layout)
    philox.refuse_capture(x, "quantize_hadamard_t (a random Hadamard transform's signs)")
    if (signs.numel() == HADAMARD_SIZE and spec.block == (1, HADAMARD_SIZE) and spec.element == E2M1
            and _use_kernel(x, spec)):
        _, col = _kernel_quantize(x, spec, seed, offset, offset, False, True, None, False, scale_layout,
                                  sign_mask(signs))
        return col
    return quantize(random_hadamard(x, signs), spec, seed=seed, offset=offset, transpose=True,
                    scale_layout=scale_layout)


def dequantize(q: QTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`reference.dequantize(q).to(dtype)` (dtype float32 or bfloat16), by the kernel where it exists."""
    if dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"dequantize: dtype must be float32 or bfloat16, got {dtype}")
    if _use_kernel(q.codes, q.spec, "dequantize") and q.scales is not None and q.scale_layout != "blackwell":
        return torch.ops.snip_C.dequantize(q.codes, reference.plain_scales(q), q.tensor_scale, q.spec.describe(),
                                           q.shape[1], dtype)
    return reference.dequantize(q).to(dtype)


def fake_quantize(x: torch.Tensor, spec: QuantSpec, *, seed: int = 0, offset: int = 0,
                  transpose: bool = False) -> torch.Tensor:
    """`reference.fake_quantize(x, spec, ...)` (float32 values of the quantized x or x^T), bit for bit,
    computed as dequantize(quantize(...)) by the native ops where they exist for the spec and device."""
    _refuse_capture_sr(x, spec)
    if _use_kernel(x, spec) and _use_kernel(x, spec, "dequantize"):
        return dequantize(quantize(x, spec, seed=seed, offset=offset, transpose=transpose))
    return reference.fake_quantize(x, spec, seed=seed, offset=offset, transpose=transpose)
