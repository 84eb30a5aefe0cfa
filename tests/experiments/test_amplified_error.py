"""The scale study's ground truth (experiments.amplified_error): with `amplify` 1 the hooked bf16 layers produce the
outputs and gradients of layers whose fprop, dgrad or wgrad runs in the precision itself, and `amplify` scales the
error alone."""

import pytest
import torch
from torch import nn

from experiments.amplified_error import AmplifiedError
from snip_ops import LinearPrecision, convert

pytestmark = pytest.mark.usefixtures("one_thread")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(200, 136), nn.Tanh(), nn.Linear(136, 72))


def _grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """The output, then the gradients of the input and of every parameter."""
    x = x.clone().requires_grad_()
    y = model(x)
    return [y.detach(), *torch.autograd.grad(y.pow(2).sum(), [x, *model.parameters()])]


def _quantized(model: nn.Module, gemm: str) -> nn.Module:
    # fp8 rounds to nearest: the same error whatever the stochastic-rounding bits of the two paths
    return convert(model, LinearPrecision(**{"fprop": "bf16", "dgrad": "bf16", "wgrad": "bf16", gemm: "fp8"}))


def _hooked(model: nn.Module, gemm: str, amplify: float, in_evaluation: bool = True, block: int | None = None) -> nn.Module:
    AmplifiedError(gemm, "fp8", amplify, in_evaluation, block).on_setup(model, None)
    return model


@pytest.mark.parametrize("gemm", ["fprop", "dgrad", "wgrad"])
def test_amplify_one_gives_the_outputs_and_gradients_of_the_quantized_gemm(gemm):
    x = torch.randn(2, 21, 200, generator=torch.Generator().manual_seed(1))  # 42 tokens: not a block multiple
    exact = _grads(convert(_model()), x)
    quantized = _grads(_quantized(_model(), gemm), x)
    hooked = _grads(_hooked(_model(), gemm, 1.0), x)
    moved = []
    for e, q, h in zip(exact, quantized, hooked):
        scale = float(e.abs().max())
        torch.testing.assert_close(h, q, rtol=0, atol=1e-5 * scale)
        moved.append(float((q - e).abs().max()) > 1e-3 * scale)
    # [output, input, weight 0, bias 0, weight 2, bias 2]: a forward error moves everything; the second layer's dgrad
    # error reaches the first layer's parameters and the first's the input; a wgrad error stays in its layer's weight
    assert moved == {"fprop": [True] * 6, "dgrad": [False, True, True, True, False, False],
                     "wgrad": [False, False, True, False, True, False]}[gemm]


@pytest.mark.parametrize("gemm", ["fprop", "dgrad", "wgrad"])
def test_amplify_scales_the_error_alone(gemm):
    """One layer: its output, dgrad or wgrad is the exact one plus amplify times the quantized GEMM's error (a
    forward error moves the gradients too, through the loss: only its output is compared)."""
    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(200, 136))
    x = torch.randn(42, 200, generator=torch.Generator().manual_seed(2))
    exact = _grads(convert(model()), x)
    quantized = _grads(_quantized(model(), gemm), x)
    amplified = _grads(_hooked(model(), gemm, 2.5), x)
    for e, q, a in list(zip(exact, quantized, amplified))[:1 if gemm == "fprop" else None]:
        torch.testing.assert_close(a - e, 2.5 * (q - e), rtol=0, atol=1e-5 * float(e.abs().max()))


def test_forward_error_in_training_only():
    """in_evaluation=False: with autograd (a training step) the forward error is there, without it (evaluation)
    the layer is exact; the default has it in both."""
    x = torch.randn(42, 200, generator=torch.Generator().manual_seed(3))
    exact, quantized = convert(_model()), _quantized(_model(), "fprop")
    trained_only, both = _hooked(_model(), "fprop", 1.0, in_evaluation=False), _hooked(_model(), "fprop", 1.0)
    with torch.no_grad():
        atol = 1e-5 * float(exact(x).abs().max())
        assert torch.equal(trained_only(x), exact(x))
        torch.testing.assert_close(both(x), quantized(x), rtol=0, atol=atol)
    torch.testing.assert_close(trained_only(x).detach(), quantized(x).detach(), rtol=0, atol=atol)


def test_one_block_only():
    """block=b: the layers of block b alone (here the Sequential's index: its layers "0" and "2")."""
    x = torch.randn(42, 200, generator=torch.Generator().manual_seed(4))
    exact = _grads(convert(_model()), x)
    for block, moves in ((0, [False, False, True, False, False, False]), (2, [False, False, False, False, True, False])):
        hooked = _grads(_hooked(_model(), "wgrad", 1.0, block=block), x)
        assert [not torch.equal(e, h) for e, h in zip(exact, hooked)] == moves


def test_unknown_gemm():
    with pytest.raises(ValueError, match="gemm must be one of"):
        AmplifiedError("forward", "fp4", 2.0)
    with pytest.raises(ValueError, match="in_evaluation=False is for fprop"):
        AmplifiedError("wgrad", "fp4", 2.0, in_evaluation=False)
