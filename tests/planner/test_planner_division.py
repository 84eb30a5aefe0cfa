"""The planner's numbers divide by tensors, never by Python numbers (tests/cuda_division.py says why):
its quantization-error estimates and Adam preconditioner must do no such division and give the same
bits under CUDA's scalar division."""

import pytest
import torch
from torch import nn

from cuda_division import CudaScalarDivision, bits
from planner.cost import LayerShape
from planner.qerror import gemm_errors
from planner.stats import LayerRecording, adam_preconditioner
from snip_ops.formats import GEMMS

pytestmark = pytest.mark.usefixtures("one_thread")


def _trained_adamw() -> torch.optim.AdamW:
    """An AdamW with state (torch's own optimizer code is not under test: built outside the mode)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 30), nn.Linear(30, 5))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
    for _ in range(3):
        model(torch.randn(8, 20)).square().mean().backward()
        opt.step()
    return opt


def _planner_outputs(opt: torch.optim.AdamW) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(6)
    x, w, dy = torch.randn(37, 200, generator=g), torch.randn(24, 200, generator=g) * 1e-2, torch.randn(37, 24, generator=g)
    rec = LayerRecording(shape=LayerShape("l", 200, 24, 37), x=x, rows=torch.arange(x.shape[0]), dy=dy, weight=w,
                         out_rms=1.0, grad_out_rms=1.0, weight_grad=w)
    out = [torch.tensor([e[k] for k in GEMMS], dtype=torch.float64)
           for e in gemm_errors(rec, ("fp8", "fp4", "nvfp4", "mxfp4"), seed=2).values()]
    params = opt.param_groups[0]["params"]
    pre = adam_preconditioner(opt, {p: torch.randn(p.shape, generator=g) for p in params})
    return out + [pre.excess_loss_weight[p] for p in params]


def test_no_scalar_divisor_in_the_planner():
    opt = _trained_adamw()
    with CudaScalarDivision() as mode:
        _planner_outputs(opt)
    assert not mode.calls, "division by a Python number (CUDA computes it as a reciprocal multiply):\n" + "\n".join(
        sorted(set(mode.calls)))
    plain = _planner_outputs(opt)
    with CudaScalarDivision():
        emulated = _planner_outputs(opt)
    assert all(torch.equal(bits(a), bits(b)) for a, b in zip(plain, emulated))
