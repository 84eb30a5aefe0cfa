"""The three GEMMs of a linear layer under a `GemmRecipe`, emulated in PyTorch (DESIGN.md §3).

Each operand is quantized exactly as the kernels quantize it (`reference.fake_quantize`, blocks along
the GEMM's reduction dimension), dequantized to float32 and multiplied in float32: this is the
reference the CUDA GEMMs are checked against and the path used where no kernel exists.

Stochastic rounding: the call's `(seed, offset)` gives each operand its own Philox stream,
`offset * 8 + operand id` with the ids below, so that no two operands of a step share random bits.
"""

from __future__ import annotations

import torch

from .formats import GemmRecipe, QuantSpec
from .reference import fake_quantize

__all__ = ["fprop", "dgrad", "wgrad", "OPERAND_IDS", "operand_offset"]

OPERAND_IDS = {"x": 0, "w": 1, "dy": 2, "wt": 3, "dyt": 4, "xt": 5}


def operand_offset(offset: int, operand: str) -> int:
    return offset * 8 + OPERAND_IDS[operand]


def _q(t: torch.Tensor, spec: QuantSpec | None, seed: int, offset: int, operand: str, transpose: bool = False):
    """The float32 operand as the GEMM sees it; `transpose` quantizes t^T (blocks along t's rows)."""
    if spec is None:
        t = t.t() if transpose else t
        return t.float()
    return fake_quantize(t, spec, seed=seed, offset=operand_offset(offset, operand), transpose=transpose)


def fprop(x: torch.Tensor, w: torch.Tensor, recipe: GemmRecipe, seed: int = 0, offset: int = 0) -> torch.Tensor:
    """y = x w^T in float32; x [M, K] (1-D blocks along K), w [N, K]."""
    if recipe.is_bf16:
        return (x @ w.t()).float()
    return _q(x, recipe.act, seed, offset, "x") @ _q(w, recipe.weight, seed, offset, "w").t()


def dgrad(dy: torch.Tensor, w: torch.Tensor, recipe: GemmRecipe, seed: int = 0, offset: int = 0) -> torch.Tensor:
    """dx = dy w in float32; dy [M, N] (blocks along N), w^T quantized with blocks along N."""
    if recipe.is_bf16:
        return (dy @ w).float()
    return _q(dy, recipe.grad, seed, offset, "dy") @ _q(w, recipe.weight, seed, offset, "wt", transpose=True).t()


def wgrad(dy: torch.Tensor, x: torch.Tensor, recipe: GemmRecipe, seed: int = 0, offset: int = 0) -> torch.Tensor:
    """dw = dy^T x in float32; both operands quantized with blocks along M (the token dimension)."""
    if recipe.is_bf16:
        return (dy.t() @ x).float()
    return _q(dy, recipe.grad, seed, offset, "dyt", transpose=True) @ _q(x, recipe.act, seed, offset, "xt", transpose=True).t()
