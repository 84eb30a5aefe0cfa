"""snip_ops.tensor_core_model: the models of the Hopper FP8 accumulator that the GEMM tests' bound covers
and that `snip doctor` fits to a GPU (tests/ops/test_bounds.py checks the bound against every model)."""

import pytest
import torch

from snip_ops.formats import recipe
from snip_ops.reference import quantize
from snip_ops.tensor_core_model import BLOCK_K, StepModel, blockwise_gemm, kernel_operands, matching_models

MODELS = [(model, group) for model in StepModel for group in (8, 16, 32)]


def _operands(m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp2(torch.randint(-6, 7, (1, k), generator=g).float())
    w = torch.randn(n, k, generator=g)
    r = recipe("fp8")
    return kernel_operands(quantize(x, r.act), quantize(w, r.weight))


def _exact_blocks(codes_a, scales_a, codes_b, scales_b):
    """Each block's exact sum, times the FP32 scale product, added to an FP32 total by one FMA."""
    a, b = codes_a.double(), codes_b.double()
    total = torch.zeros(a.shape[0], b.shape[0])
    for blk in range(scales_a.shape[1]):
        k = slice(blk * BLOCK_K, (blk + 1) * BLOCK_K)
        scale = scales_a[:, blk, None] * scales_b[None, :, blk]
        total = (total.double() + (a[:, k] @ b[:, k].t()) * scale.double()).float()
    return total


@pytest.mark.parametrize("model, group", MODELS, ids=lambda v: getattr(v, "value", v))
@pytest.mark.parametrize("k", [128, 300, 16])  # 300: a partial last block and group
def test_with_enough_bits_every_model_sums_exactly(model, group, k):
    ops = _operands(9, 11, k, seed=k)
    got = blockwise_gemm(*ops, model=model, group=group, fraction_bits=40)
    assert torch.equal(got, _exact_blocks(*ops))


def test_aligned_addition_drops_what_lies_below_the_largest_addend():
    # one product 256 and 31 products 2^-6, under an ulp of 2^(8 - 13) at 256
    row = torch.tensor([16.0] + [0.125] * 31).reshape(1, 32)
    codes = torch.cat([row, torch.zeros(1, 96)], dim=1).to(torch.float8_e4m3fn)
    ones = torch.ones(1, 1)
    for group in (8, 16, 32):
        assert blockwise_gemm(codes, ones, codes, ones, group=group).item() == 256.0
    # the exact sum 256 + 31 * 2^-6, truncated once to 13 fraction bits
    got = blockwise_gemm(codes, ones, codes, ones, model=StepModel.TRUNCATED_SUM).item()
    assert got == 256.0 + 15 * 2.0**-5
    assert blockwise_gemm(codes, ones, codes, ones, fraction_bits=15).item() == 256.0 + 31 * 2.0**-6


def test_truncation_is_toward_zero_for_either_sign():
    row = torch.tensor([[16.0, 0.125, 0.125, 0.125] + [0.0] * 124])
    codes, negated = row.to(torch.float8_e4m3fn), (-row).to(torch.float8_e4m3fn)
    ones = torch.ones(1, 1)
    pos = blockwise_gemm(codes, ones, codes, ones, model=StepModel.TRUNCATED_SUM, fraction_bits=8)
    neg = blockwise_gemm(negated, ones, codes, ones, model=StepModel.TRUNCATED_SUM, fraction_bits=8)
    assert pos.item() == 256.0 and neg.item() == -256.0  # 256 + 3 * 2^-6, with an ulp of 1


@pytest.mark.parametrize("model, group", MODELS, ids=lambda v: getattr(v, "value", v))
def test_matching_models_names_the_model_that_made_the_result(model, group):
    ops = _operands(16, 24, 512, seed=1)
    y = blockwise_gemm(*ops, model=model, group=group)
    matches = matching_models(y, *ops)
    assert len(matches) == 2 * 3 * 3
    assert matches[f"{model.value}/g{group}/p13"] == 1.0
    assert matches[f"{model.value}/g{group}/p12"] < 1.0 and matches[f"{model.value}/g{group}/p14"] < 1.0
    other = StepModel.TRUNCATED_SUM if model is StepModel.ALIGNED else StepModel.ALIGNED
    assert matches[f"{other.value}/g{group}/p13"] < 1.0


def test_bad_arguments_are_refused():
    codes_a, scales_a, codes_b, scales_b = _operands(4, 5, 256, seed=2)
    with pytest.raises(ValueError, match="group must be 8, 16 or 32"):
        blockwise_gemm(codes_a, scales_a, codes_b, scales_b, group=4)
    with pytest.raises(ValueError, match="shapes"):
        blockwise_gemm(codes_a, scales_a[:, :1], codes_b, scales_b)
    with pytest.raises(ValueError, match="shapes"):
        blockwise_gemm(codes_a[:, :128], scales_a, codes_b, scales_b)
