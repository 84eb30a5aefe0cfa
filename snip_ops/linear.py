"""`snip_ops.linear`: y = x w^T + b with each of its three GEMMs in its own precision.

The GEMMs are `torch.library` custom ops (`snip::linear_fprop`, `snip::linear_dgrad`,
`snip::linear_wgrad`) with fake implementations, so `torch.compile(fullgraph=True)` traces through
them; a thin `autograd.Function` ties them together. A recipe crosses the op boundary as its string
key, the SR offset as a 0-d int64 tensor (so a new offset each step does not recompile).
"""

from __future__ import annotations

import functools

import torch

from . import gemm
from .formats import GemmRecipe, LinearPrecision

__all__ = ["linear"]


@functools.lru_cache(maxsize=None)
def _recipe(key: str) -> GemmRecipe:
    return GemmRecipe.from_key(key)


def _no_autocast(t: torch.Tensor):
    """The GEMMs define their own numerics (FP32 GEMMs of dequantized operands): an enclosing
    autocast region must not turn those into BF16 matmuls."""
    return torch.autocast(t.device.type, enabled=False)


@torch.library.custom_op("snip::linear_fprop", mutates_args=())
def _fprop(x: torch.Tensor, w: torch.Tensor, recipe: str, seed: int, offset: torch.Tensor, emulate: bool) -> torch.Tensor:
    with _no_autocast(x):
        return gemm.fprop(x, w, _recipe(recipe), seed, int(offset), emulate, out_dtype=x.dtype)


@_fprop.register_fake
def _(x, w, recipe, seed, offset, emulate):
    return x.new_empty(x.shape[0], w.shape[0])


@torch.library.custom_op("snip::linear_dgrad", mutates_args=())
def _dgrad(dy: torch.Tensor, w: torch.Tensor, recipe: str, seed: int, offset: torch.Tensor, emulate: bool) -> torch.Tensor:
    with _no_autocast(dy):
        return gemm.dgrad(dy, w, _recipe(recipe), seed, int(offset), emulate, out_dtype=dy.dtype)


@_dgrad.register_fake
def _(dy, w, recipe, seed, offset, emulate):
    return dy.new_empty(dy.shape[0], w.shape[1])


@torch.library.custom_op("snip::linear_wgrad", mutates_args=())
def _wgrad(dy: torch.Tensor, x: torch.Tensor, recipe: str, seed: int, offset: torch.Tensor, emulate: bool) -> torch.Tensor:
    with _no_autocast(dy):
        return gemm.wgrad(dy, x, _recipe(recipe), seed, int(offset), emulate)


@_wgrad.register_fake
def _(dy, x, recipe, seed, offset, emulate):
    return dy.new_empty(dy.shape[1], x.shape[1], dtype=torch.float32)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, w, b, fprop, dgrad, wgrad, seed, offset, emulate):
        ctx.save_for_backward(x2, w, offset)
        ctx.recipes = (dgrad, wgrad)
        ctx.seed, ctx.emulate = seed, emulate
        ctx.bias_dtype = None if b is None else b.dtype
        y = torch.ops.snip.linear_fprop(x2, w, fprop, seed, offset, emulate)
        return y if b is None else y + b.to(y.dtype)

    @staticmethod
    def backward(ctx, dy):
        x2, w, offset = ctx.saved_tensors
        dgrad, wgrad = ctx.recipes
        dy = dy.contiguous()
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = torch.ops.snip.linear_dgrad(dy, w, dgrad, ctx.seed, offset, ctx.emulate)
        if ctx.needs_input_grad[1]:
            dw = torch.ops.snip.linear_wgrad(dy, x2, wgrad, ctx.seed, offset, ctx.emulate).to(w.dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            db = dy.float().sum(0).to(ctx.bias_dtype)
        return dx, dw, db, None, None, None, None, None, None


def _check(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    for name, t in (("x", x), ("w", w), ("b", b)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"linear: {name} must be a tensor, got {type(t).__name__}")
        if t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"linear: {name} must be float32, bfloat16 or float16, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"linear: {name} is on {t.device} but x is on {x.device}")
    if w.dim() != 2:
        raise ValueError(f"linear: w must be 2-D [out_features, in_features], got shape {tuple(w.shape)}")
    if x.dim() < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear: x's last dimension ({tuple(x.shape)}) must equal w.shape[1] ({w.shape[1]})")
    if x.dtype != w.dtype:
        raise TypeError(f"linear: x ({x.dtype}) and w ({w.dtype}) must have the same dtype")
    if b is not None and tuple(b.shape) != (w.shape[0],):
        raise ValueError(f"linear: b must have shape ({w.shape[0]},), got {tuple(b.shape)}")


def linear(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None = None,
    precision: LinearPrecision | GemmRecipe | str | None = None,
    *,
    seed: int = 0,
    offset: int | torch.Tensor = 0,
    emulate: bool = False,
) -> torch.Tensor:
    """`torch.nn.functional.linear` with low-precision GEMMs.

    x: [..., K]; w: [N, K]; b: [N] or None; precision: a `LinearPrecision`, a recipe, a recipe name
    ("fp8", "fp4", ...) or None for BF16 (plain `F.linear`). `(seed, offset)` key stochastic
    rounding; pass a new offset each step (0-d int64 tensor under torch.compile). On a GPU the
    quantization and GEMM kernels run where they exist (`snip_ops.gemm`); `emulate=True` keeps the
    emulated GEMMs there too (same quantized operands, FP32 GEMM of their dequantized values).
    """
    if isinstance(x, torch.Tensor) and torch.is_autocast_enabled(x.device.type):
        # What F.linear does under autocast: compute in the autocast dtype; the casts are
        # differentiable, so FP32 master weights receive FP32 gradients.
        dtype = torch.get_autocast_dtype(x.device.type)
        x, w, b = (None if t is None else t.to(dtype) for t in (x, w, b))
    _check(x, w, b)
    precision = LinearPrecision.of(precision)
    if precision.is_bf16:
        return torch.nn.functional.linear(x, w, b)
    if not torch.is_tensor(offset):
        offset = torch.tensor(offset, dtype=torch.int64)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    y = _Linear.apply(
        x2, w, b, precision.fprop.key(), precision.dgrad.key(), precision.wgrad.key(), seed, offset.detach().cpu(),
        bool(emulate),
    )
    return y.reshape(*lead, w.shape[0])
