"""The three GEMMs of a linear layer under a `GemmRecipe` (docs/design.md §3).

Emulated (the reference, and the path wherever no kernel exists): each operand is quantized exactly
as the kernels quantize it (`reference.fake_quantize`, blocks along the GEMM's reduction dimension),
dequantized to float32 and multiplied in float32 (on a GPU in float64, never TF32).

Kernels (the extension's quantizer exists for the tensor's device -- a GPU it was compiled for, or
the CPU with its host implementation -- and `emulate=False`): the operands go through
`snip_ops.quantize` (the native quantizer, transposes fused into it, bit-identical to the
reference) and `gemm_kernels.qgemm`, which runs the fastest exact GEMM of the dequantized operands
(CUTLASS FP8/FP4 on Hopper and Blackwell, else a BF16 or FP32 GEMM; the FP32 one on the CPU): the
same numbers up to the GEMM's summation order. Its Hopper side has run on H100 and H200
(bench/results/nvidia-h200-gpu-tests.txt); its Blackwell side has not run on a GPU.

One GEMM at a time, each operand quantized for it (the planner's error estimates use these);
`snip_ops.linear` organises the quantization across its three GEMMs itself (linear.py).

Stochastic rounding: the call's `(seed, offset)` gives each operand its own Philox stream,
`offset * 8 + operand id` with the ids below, so that no two operands of a step share random bits.
"""

from __future__ import annotations

import torch

from . import _ext, reference
from .formats import GemmRecipe, QuantSpec, Rounding
from .hadamard import random_hadamard, rht_signs

__all__ = ["fprop", "dgrad", "wgrad", "uses_kernels", "emulated_operand", "transpose_shares_quantization",
           "fp32_mm", "OPERAND_IDS", "operand_offset", "wgrad_operand", "hadamard_wgrad_operand"]

# A tensor's SR bits at one step, whichever layout it is quantized in: t^T ("wt", "dyt", "xt") draws t's
# (docs/design.md §2), so a fused row + column pass computes one Philox stream for both of its outputs.
# "rht": the random signs of the wgrad operands' Hadamard transform (hadamard.py), not an operand.
OPERAND_IDS = {"x": 0, "w": 1, "dy": 2, "xt": 0, "wt": 1, "dyt": 2, "rht": 6}


def operand_offset(offset: int, operand: str) -> int:
    return offset * 8 + OPERAND_IDS[operand]


def uses_kernels(t: torch.Tensor, recipe: GemmRecipe, emulate: bool = False) -> bool:
    """Whether a GEMM of `recipe` on tensors like `t` takes the kernel path: the native quantizer
    exists for t's device (a GPU, or the CPU with its host implementation; on the CPU the GEMM
    itself is the FP32 one of the emulated path, so only the quantization is faster)."""
    return (not emulate and None not in (recipe.act, recipe.weight, recipe.grad)
            and _ext.kernel_available("quantize", t.device))


def _qgemm(a: torch.Tensor, a_spec: QuantSpec, a_operand: str, a_t: bool, b: torch.Tensor, b_spec: QuantSpec,
           b_operand: str, b_t: bool, seed: int, offset: int, out_dtype: torch.dtype) -> torch.Tensor:
    """quantize(a) . quantize(b)^T on the kernels (`*_t`: quantize the transpose), FP32 accumulation,
    written once in `out_dtype`."""
    from .gemm_kernels import qgemm
    from .quantize import quantize

    qa = quantize(a, a_spec, seed=seed, offset=operand_offset(offset, a_operand), transpose=a_t)
    qb = quantize(b, b_spec, seed=seed, offset=operand_offset(offset, b_operand), transpose=b_t)
    return qgemm(qa, qb, out_dtype=out_dtype)


def fp32_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b of float32 operands, never in TF32. On a GPU in FP64: a float32 GEMM there may run in TF32
    (torch.set_float32_matmul_precision), which would drop operand bits."""
    return (a.double() @ b.double()).float() if a.is_cuda else a @ b


def emulated_operand(t: torch.Tensor, spec: QuantSpec | None, seed: int, offset: int, operand: str,
                     transpose: bool = False) -> torch.Tensor:
    """The float32 operand `operand` (a key of OPERAND_IDS) as the emulated GEMM sees it;
    `transpose` quantizes t^T (blocks along t's rows)."""
    if spec is None:
        t = t.t() if transpose else t
        return t.float()
    return reference.fake_quantize(t, spec, seed=seed, offset=operand_offset(offset, operand), transpose=transpose)


def transpose_shares_quantization(spec: QuantSpec | None) -> bool:
    """Whether quantizing t^T gives exactly the transpose of quantizing t: square blocks anchored at
    (0, 0) and rounding that draws no position-keyed random bits (the 128x128 weight blocks)."""
    if spec is None:
        return True
    br, bc = spec.block
    return br == bc and br > 0 and spec.rounding != Rounding.SR


def fprop(x: torch.Tensor, w: torch.Tensor, recipe: GemmRecipe, seed: int = 0, offset: int = 0,
          emulate: bool = False, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """y = x w^T, accumulated in float32, rounded once to `out_dtype`; x [M, K] (1-D blocks along K), w [N, K]."""
    if recipe.is_bf16:
        return (x @ w.t()).to(out_dtype)
    if uses_kernels(x, recipe, emulate):
        return _qgemm(x, recipe.act, "x", False, w, recipe.weight, "w", False, seed, offset, out_dtype)
    xq = emulated_operand(x, recipe.act, seed, offset, "x")
    wq = emulated_operand(w, recipe.weight, seed, offset, "w")
    return fp32_mm(xq, wq.t()).to(out_dtype)


def dgrad(dy: torch.Tensor, w: torch.Tensor, recipe: GemmRecipe, seed: int = 0, offset: int = 0,
          emulate: bool = False, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """dx = dy w, accumulated in float32, rounded once to `out_dtype`; dy [M, N] (blocks along N),
    w^T quantized with blocks along N."""
    if recipe.is_bf16:
        return (dy @ w).to(out_dtype)
    if uses_kernels(dy, recipe, emulate):
        return _qgemm(dy, recipe.grad, "dy", False, w, recipe.weight, "wt", True, seed, offset, out_dtype)
    dyq = emulated_operand(dy, recipe.grad, seed, offset, "dy")
    wtq = emulated_operand(w, recipe.weight, seed, offset, "wt", transpose=True)
    return fp32_mm(dyq, wtq.t()).to(out_dtype)


def wgrad_operand(t: torch.Tensor, recipe: GemmRecipe, seed: int, offset: int) -> torch.Tensor:
    """dy or x as wgrad quantizes it (transposed, blocks along M): t itself, or T t, its random
    Hadamard transform (float32, tokens padded to the transform size) under a recipe with
    `wgrad_hadamard`; both operands of one call get the same T."""
    if not recipe.wgrad_hadamard:
        return t
    signs = rht_signs(seed, operand_offset(offset, "rht"), recipe.wgrad_hadamard, device=t.device)
    return random_hadamard(t, signs)


def hadamard_wgrad_operand(t: torch.Tensor, recipe: GemmRecipe, spec: QuantSpec, seed: int, offset: int,
                           operand: str, kernels: bool, scale_layout: str = "plain"):
    """(T t)^T quantized with `spec`, the wgrad operand `operand` ("dyt" or "xt") of a recipe with
    `wgrad_hadamard`: on the kernels a QTensor from the native quantizer with the transform fused in
    (`quantize.quantize_hadamard_t`), else its float32 emulated values."""
    if kernels:
        from .quantize import quantize_hadamard_t

        signs = rht_signs(seed, operand_offset(offset, "rht"), recipe.wgrad_hadamard)
        return quantize_hadamard_t(t, spec, signs, seed=seed, offset=operand_offset(offset, operand),
                                   scale_layout=scale_layout)
    return emulated_operand(wgrad_operand(t, recipe, seed, offset), spec, seed, offset, operand, transpose=True)


def wgrad(dy: torch.Tensor, x: torch.Tensor, recipe: GemmRecipe, seed: int = 0, offset: int = 0,
          emulate: bool = False) -> torch.Tensor:
    """dw = dy^T x in float32; both operands quantized with blocks along M (the token dimension),
    after the recipe's random Hadamard transform on M if it has one."""
    if recipe.is_bf16:
        return (dy.t() @ x).float()
    kernels = uses_kernels(dy, recipe, emulate)
    if recipe.wgrad_hadamard:
        a = hadamard_wgrad_operand(dy, recipe, recipe.grad, seed, offset, "dyt", kernels)
        b = hadamard_wgrad_operand(x, recipe, recipe.act, seed, offset, "xt", kernels)
        if kernels:
            from .gemm_kernels import qgemm

            return qgemm(a, b, out_dtype=torch.float32)
        return fp32_mm(a, b.t())
    if kernels:
        return _qgemm(dy, recipe.grad, "dyt", True, x, recipe.act, "xt", True, seed, offset, torch.float32)
    dytq = emulated_operand(dy, recipe.grad, seed, offset, "dyt", transpose=True)
    xtq = emulated_operand(x, recipe.act, seed, offset, "xt", transpose=True)
    return fp32_mm(dytq, xtq.t())
