"""The tests' error bounds (tests/bounds.py), checked on the CPU: FP32 GEMMs summed in the worst orders
stay inside the GEMM bound, real bugs land far outside it, and every model of the Hopper FP8
accumulator (snip_ops/tensor_core_model.py) stays inside the tensor-core bound that the GPU tests use."""

import pytest
import torch

from bounds import (TC_BLOCK_K, assert_within, assert_within_gemm_bound, gemm_error_bound, qgemm_error_bound,
                    tensor_core_fp8_gemm_error_bound, then_rounded)
from snip_ops import gemm_kernels as gk
from snip_ops.formats import recipe
from snip_ops.reference import dequantize, quantize
from snip_ops.tensor_core_model import StepModel, blockwise_gemm, kernel_operands


def _operands(m=24, n=40, k=300, seed=0):
    """fp8 fprop operands with magnitudes over several binades (blocks of very different scales)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-6, 7, (m, 1), generator=g).float())
    w = torch.randn(n, k, generator=g) * torch.exp2(torch.randint(-6, 7, (1, k), generator=g).float())
    r = recipe("fp8")
    return quantize(x, r.act), quantize(w, r.weight)


def _sequential_fp32(a, b):
    """a @ b^T summed left to right in float32: K - 1 roundings in a row, the order gamma_K is tight for."""
    acc = torch.zeros(a.shape[0], b.shape[0])
    for i in range(a.shape[1]):
        acc = acc + a[:, i : i + 1] * b[:, i]
    return acc


@pytest.mark.parametrize("order", ["blas", "sequential", "reversed", "fp64_rounded"])
def test_fp32_gemm_orders_stay_inside_the_bound(order):
    qa, qb = _operands()
    a, b = dequantize(qa), dequantize(qb)
    got = {"blas": lambda: a @ b.t(), "sequential": lambda: _sequential_fp32(a, b),
           "reversed": lambda: _sequential_fp32(a.flip(1), b.flip(1)),
           "fp64_rounded": lambda: (a.double() @ b.double().t()).float()}[order]()
    assert_within_gemm_bound(got, a, b, what=order)
    assert_within_gemm_bound(got.bfloat16(), a, b, rounded_to=(torch.bfloat16,), what=f"{order}, bf16 output")


def test_gemm_bound_catches_real_bugs():
    qa, qb = _operands()
    a, b = dequantize(qa), dequantize(qb)
    ref = a.double() @ b.double().t()
    bound = gemm_error_bound(a, b) + gemm_error_bound(a, b, torch.float64)
    one_scale_off, block_dropped = a.clone(), a.clone()
    one_scale_off[3, :128] *= 1 + 2**-7
    block_dropped[:, 128:256] = 0
    for what, wrong in (("one block's scale 2^-7 off", one_scale_off), ("a 1x128 block dropped", block_dropped),
                        ("codes without scales", qa.codes.float())):
        with pytest.raises(AssertionError, match="exceed the bound"):
            assert_within(wrong @ b.t(), ref, bound, what)
    # NaN exactly where the reference has it
    with pytest.raises(AssertionError, match="NaN positions differ"):
        assert_within(torch.full((2,), float("nan")), torch.zeros(2), 1.0)
    assert_within(torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0]), 0.0)


def test_then_rounded_covers_a_bias_add_and_a_bf16_cast():
    qa, qb = _operands(seed=1)
    a, b = dequantize(qa), dequantize(qb)
    bias = torch.randn(b.shape[0], generator=torch.Generator().manual_seed(2)) * 100
    ref = a.double() @ b.double().t() + bias.double()
    bound = then_rounded(gemm_error_bound(a, b) + gemm_error_bound(a, b, torch.float64), ref, torch.float32,
                         torch.bfloat16)
    assert_within(((a @ b.t()) + bias).bfloat16(), ref, bound)


def test_qgemm_bounds_nest_and_cover_the_cpu_path():
    qa, qb = _operands(seed=4)
    a, b = dequantize(qa), dequantize(qb)
    fp32 = qgemm_error_bound("fp32", a, b)
    assert_within(gk.qgemm(qa, qb, out_dtype=torch.float32), a.double() @ b.double().t(),
                  fp32 + gemm_error_bound(a, b, torch.float64))
    for path in ("bf16_exact", "sm100_nvfp4", "sm90_fp8"):  # each allows at least an FP32 GEMM's error
        assert (qgemm_error_bound(path, a, b) >= fp32).all(), path
    with pytest.raises(ValueError, match="unknown GEMM path"):
        qgemm_error_bound("tf32", a, b)


@pytest.mark.parametrize("model", list(StepModel), ids=lambda m: m.value)
@pytest.mark.parametrize("group", [8, 16, 32])
@pytest.mark.parametrize("m, n, k", [(24, 40, 300), (32, 48, 1040), (5, 7, 128), (3, 9, 4112)])
def test_tensor_core_bound_holds_for_every_accumulator_model(model, group, m, n, k):
    # operands with magnitudes over 13 binades along K: one product can dominate a group, the case in
    # which aligning to the largest addend loses the most
    qa, qb = _operands(m=m, n=n, k=k, seed=k + group)
    a, b = dequantize(qa), dequantize(qb)
    got = blockwise_gemm(*kernel_operands(qa, qb), model=model, group=group)
    ref = a.double() @ b.double().t()
    assert_within(got, ref, tensor_core_fp8_gemm_error_bound(a, b) + gemm_error_bound(a, b, torch.float64))


def test_tensor_core_bound_still_rejects_bugs():
    qa, qb = _operands(m=32, n=48, k=1040, seed=3)
    a, b = dequantize(qa), dequantize(qb)
    got = blockwise_gemm(*kernel_operands(qa, qb), model=StepModel.ALIGNED, group=32).double()
    ref = a.double() @ b.double().t()
    bound = tensor_core_fp8_gemm_error_bound(a, b) + gemm_error_bound(a, b, torch.float64)
    one_block = a[:, :TC_BLOCK_K].double() @ b[:, :TC_BLOCK_K].double().t()
    for what, wrong in (("one block's scale 1/4 off", got + one_block / 4), ("a block dropped", got - one_block),
                        ("a transposed operand", (a.double() @ b.double().t().flip(1)))):
        with pytest.raises(AssertionError, match="exceed the bound"):
            assert_within(wrong, ref, bound, what)
