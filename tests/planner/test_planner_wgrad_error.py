"""e_wgrad from a row sample is the relative error of the whole batch's weight gradient: the rows'
quantization errors add up independently while their products add up as far as the tokens agree, so
the sample's own relative error would overstate it by up to M / m (planner/qerror.py)."""

import statistics
from types import SimpleNamespace

import pytest
import torch

from planner.qerror import gemm_errors, relative_error
from snip_ops import gemm
from snip_ops.formats import recipe

pytestmark = pytest.mark.usefixtures("one_thread")

M, SAMPLE, K, N = 1024, 128, 96, 40


def _recording(x, dy, rows, weight_grad):
    return SimpleNamespace(x=x[rows], dy=dy[rows], weight=torch.randn(N, K), rows=rows,
                           shape=SimpleNamespace(tokens=x.shape[0]), weight_grad=weight_grad)


def test_sampled_rows_estimate_the_whole_batch_wgrad_error():
    """Tokens whose gradients partly agree (a direction shared by x and dy, of either sign per token) make
    dW partly coherent: FP4's e_wgrad from 128 of 1024 rows matches the whole batch's within 6 standard
    errors of the samples' spread (plus the whole batch's own over SR seeds), while the sample's own relative
    error is twice the whole batch's. The estimate assumes the rows' quantization errors add up
    independently (stochastic rounding makes dy's so; x's round to nearest, and a direction shared by many
    tokens would make their errors agree too: the tiny model's recorded rows behave as independent, the
    estimate reading a median 1.05x, 1.03x and 1.02x the whole batch's error at 100, 400 and 1200 steps)."""
    g = torch.Generator().manual_seed(0)
    sign = torch.randn(M, 1, generator=g).sign()
    x = 0.2 * sign * torch.randn(1, K, generator=g) + torch.randn(M, K, generator=g)
    dy = 0.2 * sign * torch.randn(1, N, generator=g) + torch.randn(M, N, generator=g)
    dw = gemm.fp32_mm(dy.t(), x)
    whole = [gemm_errors(_recording(x, dy, torch.arange(M), dw), ("fp4",), seed=s)["fp4"]["wgrad"] for s in range(4)]
    estimates, own = [], []
    for s in range(16):
        rows = torch.randperm(M, generator=g)[:SAMPLE].sort().values
        estimates.append(gemm_errors(_recording(x, dy, rows, dw), ("fp4",), seed=100 + s)["fp4"]["wgrad"])
        own.append(relative_error(gemm.wgrad(dy[rows], x[rows], recipe("fp4"), seed=100 + s, emulate=True),
                                  gemm.fp32_mm(dy[rows].t(), x[rows])))
    standard_error = (statistics.variance(estimates) / len(estimates)
                      + statistics.variance(whole) / len(whole)) ** 0.5
    assert abs(statistics.mean(estimates) - statistics.mean(whole)) < 6 * standard_error
    assert statistics.mean(own) > 1.8 * statistics.mean(whole)  # what the sample's own ratio would say


def test_every_row_sampled_is_the_samples_relative_error():
    g = torch.Generator().manual_seed(1)
    x, dy = torch.randn(77, K, generator=g), torch.randn(77, N, generator=g)
    dw = gemm.fp32_mm(dy.t(), x)
    got = gemm_errors(_recording(x, dy, torch.arange(77), dw), ("fp4",), seed=3)["fp4"]["wgrad"]
    assert got == relative_error(gemm.wgrad(dy, x, recipe("fp4"), seed=3, emulate=True), dw)


def test_zero_weight_gradient():
    """No gradient at all: no error (0), or an error with nothing to be relative to (inf), as relative_error."""
    x, dy = torch.zeros(16, K), torch.zeros(16, N)
    rec = _recording(x, dy, torch.arange(16), torch.zeros(N, K))
    assert gemm_errors(rec, ("fp4",))["fp4"]["wgrad"] == 0.0
    g = torch.Generator().manual_seed(2)
    rec = _recording(torch.randn(16, K, generator=g), torch.randn(16, N, generator=g), torch.arange(16), torch.zeros(N, K))
    assert gemm_errors(rec, ("fp4",))["fp4"]["wgrad"] == float("inf")
