"""A model of how the Hopper blockwise FP8 GEMM (snip_C::fp8_gemm_nt_blockwise, wgmma on sm_90a) sums:
what the GEMM tests' error bound assumes (tests/bounds.py) and what `snip doctor` compares a GPU with.

Inside each 128-wide K block the kernel issues four wgmma k-steps of 32 into a tensor-core accumulator
that starts at zero. The FP8 tensor core keeps about 13 fraction bits there (an "FP22", e8m13,
accumulator); how it adds is not documented. Two models of one addition of a group of g exact
products to the accumulator, g = 8, 16 or 32 (how many products one hardware adder takes is unknown):

  ALIGNED        (Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021): the accumulator and
                 the g products are aligned to the largest exponent among them, each truncated toward
                 zero to `fraction_bits` below it, summed exactly, and the sum truncated to
                 `fraction_bits` fraction bits;
  TRUNCATED_SUM  the exact sum of the accumulator and the products, truncated once.

After each block CUTLASS promotes (MainloopSm90TmaGmmaWarpSpecializedBlockwiseFP8): the two blocks'
FP32 scales are multiplied in FP32 and the block's sum is added to an FP32 total by one FMA, in K order.
That is the fprop / dgrad layout (A scales per row, one B scale per 128 rows); with per-row B scales
(wgrad) CUTLASS rounds sum x scale_a before the FMA with scale_b, which this model does not copy.
"""

from __future__ import annotations

import enum

import torch

from .gemm_kernels import hopper_scales
from .reference import QTensor

__all__ = ["StepModel", "blockwise_gemm", "kernel_operands", "matching_models", "BLOCK_K"]

BLOCK_K = 128


class StepModel(enum.Enum):
    ALIGNED = "aligned"
    TRUNCATED_SUM = "truncated_sum"


def _truncate(x: torch.Tensor, quantum: torch.Tensor) -> torch.Tensor:
    """x truncated toward zero to a multiple of `quantum` (a power of two; 0 where x is 0)."""
    return torch.where(quantum > 0, torch.trunc(x / torch.where(quantum > 0, quantum, 1.0)) * quantum, x)


def _ulp(x: torch.Tensor, fraction_bits: int) -> torch.Tensor:
    """2^(floor(log2 |x|) - fraction_bits), 0 where x is 0."""
    _, e = torch.frexp(x)
    return torch.where(x == 0, 0.0, torch.ldexp(torch.ones_like(x), e - 1 - fraction_bits))


def _add_group(acc: torch.Tensor, products: torch.Tensor, model: StepModel, fraction_bits: int) -> torch.Tensor:
    """acc [M, N] plus products [M, N, g] (exact), as the tensor core's accumulator would under `model`."""
    if model is StepModel.ALIGNED:
        addends = torch.cat([acc[..., None], products], dim=-1)
        quantum = _ulp(addends.abs().amax(dim=-1, keepdim=True), fraction_bits)
        total = _truncate(addends, quantum).sum(dim=-1)  # multiples of one quantum: exact in float64
    else:
        total = acc + products.sum(dim=-1)
    return _truncate(total, _ulp(total, fraction_bits))


def kernel_operands(a: QTensor, b: QTensor) -> tuple[torch.Tensor, ...]:
    """`blockwise_gemm`'s operands for qgemm(a, b) on FP8 QTensors with blocks along K: (codes_a,
    scales_a, codes_b, scales_b), the scales one per row and K block as the kernel gets A's
    (gemm_kernels.hopper_scales; a 128x128-blocked operand's repeated over its block's rows)."""
    def row_scales(q: QTensor) -> torch.Tensor:
        return hopper_scales(q, "a")[0][:, : q.shape[0]].t()

    return a.codes, row_scales(a), b.codes, row_scales(b)


def blockwise_gemm(codes_a: torch.Tensor, scales_a: torch.Tensor, codes_b: torch.Tensor, scales_b: torch.Tensor,
                   *, model: StepModel = StepModel.ALIGNED, group: int = 32, fraction_bits: int = 13) -> torch.Tensor:
    """The kernel's FP32 result under the model, for codes_a [M, K] and codes_b [N, K] (FP8 codes, any
    dtype that holds them) with FP32 scales scales_a [M, K/128] and scales_b [N, K/128], one per row and
    128-wide K block (a 128x128-blocked operand's scale repeated over its block's rows)."""
    if group not in (8, 16, 32):
        raise ValueError(f"group must be 8, 16 or 32 (products per tensor-core addition), got {group}")
    (m, k), n = codes_a.shape, codes_b.shape[0]
    blocks = -(-k // BLOCK_K)
    if codes_b.shape[1] != k or scales_a.shape != (m, blocks) or scales_b.shape != (n, blocks):
        raise ValueError(f"shapes: codes {tuple(codes_a.shape)} x {tuple(codes_b.shape)}, scales "
                         f"{tuple(scales_a.shape)} x {tuple(scales_b.shape)}; want [{m}, {blocks}] and [{n}, {blocks}]")
    a, b = codes_a.double(), codes_b.double()
    total = torch.zeros(m, n, dtype=torch.float32, device=a.device)
    for blk in range(blocks):
        acc = torch.zeros(m, n, dtype=torch.float64, device=a.device)
        for k0 in range(blk * BLOCK_K, min(k, (blk + 1) * BLOCK_K), group):
            products = a[:, None, k0:k0 + group] * b[None, :, k0:k0 + group]  # FP8 x FP8: exact
            acc = _add_group(acc, products, model, fraction_bits)
        scale = scales_a[:, blk, None].float() * scales_b[None, :, blk].float()  # FP32 product
        # one FMA: the block's sum (14 significant bits) times the scale (24) is exact in float64
        total = (total.double() + acc * scale.double()).float()
    return total


def matching_models(y: torch.Tensor, codes_a: torch.Tensor, scales_a: torch.Tensor, codes_b: torch.Tensor,
                    scales_b: torch.Tensor, fraction_bits: tuple[int, ...] = (12, 13, 14)) -> dict[str, float]:
    """For every model (each StepModel with 8, 16 or 32 products per addition and each of
    `fraction_bits`), named "<model>/g<group>/p<bits>": the fraction of the kernel's FP32 result `y`
    [M, N] (for the operands of `blockwise_gemm`) that the model reproduces bit for bit."""
    y = y.detach().float().cpu()
    args = [t.detach().cpu() for t in (codes_a, scales_a, codes_b, scales_b)]
    return {f"{model.value}/g{group}/p{bits}":
            float((blockwise_gemm(*args, model=model, group=group, fraction_bits=bits) == y).float().mean())
            for model in StepModel for group in (8, 16, 32) for bits in fraction_bits}
