"""The backward-only ground truth of bench_planner.py wd_scale: with `amplify` 1 the hooked bf16 layers produce the
gradients of layers whose dgrad (or wgrad) runs in the precision itself, and `amplify` scales the error alone."""

import copy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_planner import AmplifiedBackwardError  # noqa: E402
from snip_ops import LinearPrecision, convert  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(200, 136), nn.Tanh(), nn.Linear(136, 72))


def _grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    x = x.clone().requires_grad_()
    loss = model(x).pow(2).sum()
    return torch.autograd.grad(loss, [x, *model.parameters()])


def _quantized(model: nn.Module, gemm: str) -> nn.Module:
    # fp8 rounds to nearest: the same error whatever the stochastic-rounding bits of the two paths
    return convert(model, LinearPrecision(**{"fprop": "bf16", "dgrad": "bf16", "wgrad": "bf16", gemm: "fp8"}))


def _hooked(model: nn.Module, gemm: str, amplify: float) -> nn.Module:
    AmplifiedBackwardError(gemm, "fp8", amplify).on_setup(model, None)
    return model


@pytest.mark.parametrize("gemm", ["dgrad", "wgrad"])
def test_amplify_one_gives_the_gradients_of_the_quantized_gemm(gemm):
    x = torch.randn(2, 21, 200, generator=torch.Generator().manual_seed(1))  # 42 tokens: not a block multiple
    exact = _grads(convert(_model()), x)
    quantized = _grads(_quantized(_model(), gemm), x)
    hooked = _grads(_hooked(_model(), gemm, 1.0), x)
    moved = []
    for e, q, h in zip(exact, quantized, hooked):
        scale = float(e.abs().max())
        torch.testing.assert_close(h, q, rtol=0, atol=1e-5 * scale)
        moved.append(float((q - e).abs().max()) > 1e-3 * scale)
    # [input, weight 0, bias 0, weight 2, bias 2]: the second layer's dgrad error reaches the first layer's
    # parameters and the first's the input; a wgrad error stays in the weight of its layer
    assert moved == ([True, True, True, False, False] if gemm == "dgrad" else [False, True, False, True, False])


@pytest.mark.parametrize("gemm", ["dgrad", "wgrad"])
def test_amplify_scales_the_error_alone(gemm):
    """One layer: its dgrad or wgrad is the exact one plus amplify times the quantized GEMM's error."""
    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(200, 136))
    x = torch.randn(42, 200, generator=torch.Generator().manual_seed(2))
    exact = _grads(convert(model()), x)
    quantized = _grads(_quantized(model(), gemm), x)
    amplified = _grads(_hooked(model(), gemm, 2.5), x)
    for e, q, a in zip(exact, quantized, amplified):
        torch.testing.assert_close(a - e, 2.5 * (q - e), rtol=0, atol=1e-5 * float(e.abs().max()))


def test_only_backward_gemms_are_amplified():
    with pytest.raises(ValueError, match="dgrad or wgrad"):
        AmplifiedBackwardError("fprop", "fp4", 2.0)
