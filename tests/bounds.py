"""Floating-point error bounds for the tests' comparisons: a bound holds on every CPU, BLAS, thread
count and GPU, and a real bug (a wrong scale, operand or transpose) lands orders of magnitude above it.

GEMMs (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 3.1): K products
formed and summed in a format of unit roundoff u, in ANY order (sequential, blocked, pairwise, split
across threads, with or without FMA), satisfy elementwise

    |fl(A B^T) - A B^T| <= gamma_K |A| |B|^T,   gamma_K = K u / (1 - K u),

plus, for underflow, at most the format's smallest normal number per operation (2K of them), which
also covers flush-to-zero. A later rounding of a result r to a format of unit roundoff u' (adding a
bias, casting to BF16) adds u' |r| <= u' (|exact| + the bound so far).
"""

from __future__ import annotations

import torch

# Hopper FP8 tensor cores (wgmma, sm_90a) sum each 128-wide K block of the blockwise kernel in a
# reduced-precision accumulator that keeps 13 fraction bits (snip_ops/tensor_core_model.py); CUTLASS then
# promotes the block's sum to FP32 and scales it. How one addition of a group of products works is not
# documented: the bound holds for either model there (products aligned to the largest addend and
# truncated, or the exact sum truncated once), with 8, 16 or 32 products per addition.
TC_BLOCK_K = 128
TC_FRACTION_BITS = 13
TC_GROUPS = (8, 16, 32)


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def gamma(n: int, dtype: torch.dtype = torch.float32) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative bound of n roundings in a row."""
    nu = n * unit_roundoff(dtype)
    if nu >= 1:
        raise ValueError(f"gamma_{n} is unbounded for {dtype}")
    return nu / (1 - nu)


def abs_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a| @ |b|^T in float64 (a [M, K], b [N, K]): the magnitudes every GEMM bound scales with."""
    return a.double().abs() @ b.double().abs().t()


def gemm_error_bound(a: torch.Tensor, b: torch.Tensor, accumulate: torch.dtype = torch.float32) -> torch.Tensor:
    """[M, N] float64 bound on |fl(a @ b^T) - a @ b^T| for a [M, K] and b [N, K] multiplied and summed
    in `accumulate`, in any order."""
    k = a.shape[-1]
    # |a| @ |b|^T is itself summed in float64: non-negative terms, relative error <= gamma_K(float64).
    mag = abs_product(a, b) * (1 + gamma(k, torch.float64))
    return gamma(k, accumulate) * mag + 2 * k * torch.finfo(accumulate).tiny


def _tensor_core_block_errors(a: torch.Tensor, b: torch.Tensor, group: int) -> torch.Tensor:
    """[M, N] float64: the sum over the 128-wide K blocks of a bound on each block accumulator's error,
    for additions of `group` products (tensor_core_model: ALIGNED, which also covers TRUNCATED_SUM).
    One addition of g products p_i to an accumulator c: each of the g + 1 addends is truncated below
    2^-13 of the largest (at most max(|c|, max_i |a_i| max_i |b_i|)), and the sum s to 13 fraction
    bits (2^-13 |s|); |c| is bounded by the exact partial sum plus the error so far."""
    u = 2.0**-TC_FRACTION_BITS
    a, b = a.double(), b.double()
    k = a.shape[-1]
    slack = 1 + gamma(k, torch.float64)  # the float64 partial sums' own rounding
    total = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64, device=a.device)
    for k0 in range(0, k, TC_BLOCK_K):
        partial, err = torch.zeros_like(total), torch.zeros_like(total)
        for g0 in range(k0, min(k, k0 + TC_BLOCK_K), group):
            ga, gb = a[:, g0 : g0 + group], b[:, g0 : g0 + group]
            largest = torch.maximum((partial.abs() + err) * slack,
                                    ga.abs().amax(dim=1)[:, None] * gb.abs().amax(dim=1)[None, :])
            align = (ga.shape[1] + 1) * u * largest
            partial = partial + ga @ gb.t()
            err = err + align + u * ((partial.abs() + err) * slack + align)
        total += err
    return total


def tensor_core_fp8_gemm_error_bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[M, N] float64 bound on the Hopper blockwise FP8 GEMM (snip_C::fp8_gemm_nt_blockwise) against the
    exact product of the dequantized operands a [M, K], b [N, K]: every block's accumulator error
    (`_tensor_core_block_errors`, the largest over the group sizes), then per block an FP32 scale
    product, the block sum times it and its FP32 addition into the total, plus one rounding in each
    dequantized operand of the reference (code times an FP32 scale): gamma_{blocks + 4} of |a| |b|^T."""
    k = a.shape[-1]
    blocks = -(-k // TC_BLOCK_K)
    block_errors = torch.stack([_tensor_core_block_errors(a, b, g) for g in TC_GROUPS]).amax(dim=0)
    mag = abs_product(a, b) * (1 + gamma(k, torch.float64))
    promotion = gamma(blocks + 4, torch.float32)
    return block_errors * (1 + promotion) + promotion * mag + 2 * k * torch.finfo(torch.float32).tiny


def qgemm_error_bound(path: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[M, N] float64 bound on |gemm_kernels.qgemm(qa, qb, path=path) - a @ b^T| for the dequantized
    operands a [M, K], b [N, K], up to the path's own output (FP32; BF16 from the sm100 kernels, whose
    rounding `then_rounded` adds). Per path:
      sm90_fp8, sm90_fp4  the Hopper tensor-core bound above.
      sm100_fp8, sm100_fp4  Blackwell's blockwise kernel (the same per-block scaling and promotion),
                          its tcgen05 accumulation within a block assumed no worse than Hopper's.
      blockwise_bf16      per K chunk (c <= K wide) of constant scales a BF16 tensor-core GEMM of the
                          element values, accumulation truncating (2 gamma_c), the chunk's scale product
                          and its product with the partial sums (gamma_2), the sum of the chunks
                          (gamma_{K/c}, <= gamma_K), the reference operands' roundings (gamma_6):
                          within gamma_{3K+8}.
      sm100_*             Blackwell block-scaled tcgen05 MMAs, assumed to accumulate in FP32 (CUTLASS's
                          float accumulator; not yet run), products and block scales exact: gamma_K.
      bf16_exact          BF16 tensor cores whose FP32 accumulation truncates instead of rounding
                          (Fasi et al., 2021, on NVIDIA tensor cores): twice gamma_K.
      fp32                an FP64 GEMM (on a GPU) rounded to FP32; on the CPU an FP32 GEMM.
    sm100_* and bf16_exact add 6 roundings per product term: the nvfp4 tensor scales applied to the sum
    (2) and the reference's dequantized operands (code times scale times tensor scale, 2 each)."""
    if path in ("sm90_fp8", "sm90_fp4", "sm100_fp8", "sm100_fp4"):
        return tensor_core_fp8_gemm_error_bound(a, b)
    if path == "blockwise_bf16":
        k = a.shape[-1]
        mag = abs_product(a, b) * (1 + gamma(k, torch.float64))
        return gamma(3 * k + 8) * mag + 2 * k * torch.finfo(torch.float32).tiny
    scales = gamma(6) * abs_product(a, b)
    if path.startswith("sm100_"):
        return gemm_error_bound(a, b) + scales
    if path == "bf16_exact":
        return 2 * gemm_error_bound(a, b) + scales
    if path != "fp32":
        raise ValueError(f"unknown GEMM path {path!r}")
    if a.is_cuda:
        return then_rounded(gemm_error_bound(a, b, torch.float64), a.double() @ b.double().t(), torch.float32)
    return gemm_error_bound(a, b)


def then_rounded(bound: torch.Tensor, ref: torch.Tensor, *dtypes: torch.dtype) -> torch.Tensor:
    """The bound after the result is rounded to each of `dtypes` in turn (a bias added in FP32, a cast
    to BF16): each rounding adds u |result| <= u (|ref| + bound)."""
    for dtype in dtypes:
        bound = bound + unit_roundoff(dtype) * (ref.double().abs() + bound)
    return bound


def assert_within(got: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor | float, what: str = "") -> None:
    """|got - ref| <= bound elementwise (in float64); NaN exactly where ref is NaN."""
    got, ref = got.double(), ref.double()
    assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(got), nan), f"{what}: NaN positions differ"
    bound = torch.as_tensor(bound, dtype=torch.float64, device=ref.device).expand_as(ref)
    excess = torch.where(nan, 0.0, (got - ref).abs() - bound)
    if (excess > 0).any():
        i = int(excess.reshape(-1).argmax())
        where = [int(v) for v in torch.unravel_index(torch.tensor(i), tuple(ref.shape))]
        g, r, b = (float(t.reshape(-1)[i]) for t in (got, ref, bound))
        raise AssertionError(f"{what}: {int((excess > 0).sum())} of {ref.numel()} elements exceed the bound; "
                             f"worst at {where}: got {g!r}, ref {r!r}, |diff| {abs(g - r):.3e} > bound {b:.3e}")


def assert_within_gemm_bound(got: torch.Tensor, a: torch.Tensor, b: torch.Tensor, ref: torch.Tensor | None = None, *,
                             rounded_to: tuple[torch.dtype, ...] = (), what: str = "") -> None:
    """`got` is a @ b^T (a [M, K], b [N, K]) accumulated in FP32, then rounded to each of `rounded_to`.
    `ref` defaults to the FP64 product, whose own error is part of the bound; a given `ref` (the
    product plus a bias, in FP64) adds one FP64 rounding, which the FP32 rounding of that sum in
    `rounded_to` covers many times over."""
    if ref is None:
        ref = a.double() @ b.double().t()
    bound = gemm_error_bound(a, b) + gemm_error_bound(a, b, torch.float64)
    assert_within(got, ref, then_rounded(bound, ref, *rounded_to), what)


def relative_frobenius(bound: torch.Tensor, ref: torch.Tensor) -> float:
    """||bound|| / ||ref||: how far an elementwise bound can move a relative Frobenius error."""
    return float(bound.double().norm() / ref.double().norm()) if ref.numel() else 0.0

