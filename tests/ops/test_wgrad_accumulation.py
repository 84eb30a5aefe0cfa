"""Fused weight-gradient accumulation: `linear(..., wgrad_into=)` and `SnipLinear(fuse_wgrad_accumulation=True)`
add the weight gradient into an FP32 buffer (Megatron's `main_grad`) instead of `weight.grad`."""

import pytest
import torch

from snip_ops import SnipLinear, convert
from snip_ops.linear import linear

PRECISIONS = ["fp8", "fp4", "nvfp4", "bf16", {"fprop": "fp8", "dgrad": "fp4", "wgrad": "bf16"}]


def _steps(precision, fused: bool, dtype=torch.float32, micro_batches=3):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(40, 256, generator=g, dtype=dtype).requires_grad_()
    xs = [torch.randn(72, 256, generator=g, dtype=dtype).requires_grad_() for _ in range(micro_batches)]
    main_grad = torch.zeros(40, 256) if fused else None
    for i, x in enumerate(xs):
        y = linear(x, w, None, precision, seed=3, offset=i, wgrad_into=main_grad)
        (y.float() * torch.linspace(-1, 1, 40)).square().sum().backward()
    return w, xs, main_grad


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_buffer_gets_what_weight_grad_would(precision):
    # FP32 weights: autograd's accumulation into w.grad is the same FP32 addition, so the bits agree; the
    # input gradients are untouched.
    w, xs, _ = _steps(precision, fused=False)
    fw, fxs, main_grad = _steps(precision, fused=True)
    assert fw.grad is None
    assert torch.equal(main_grad, w.grad)
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(fxs, xs))


def test_bf16_weights_accumulate_in_fp32():
    # BF16 weights: the buffer holds the FP32 sum, which w.grad (BF16, rounded per micro-batch) cannot
    w, _, _ = _steps("fp8", fused=False, dtype=torch.bfloat16)
    fw, _, main_grad = _steps("fp8", fused=True, dtype=torch.bfloat16)
    assert fw.grad is None and main_grad.dtype == torch.float32
    assert (main_grad.bfloat16().float() - w.grad.float()).abs().max() <= 2 ** -6 * w.grad.float().abs().max()


def test_compiled_matches_eager():
    w = torch.randn(40, 256, requires_grad=True)
    x = torch.randn(72, 256)
    eager, compiled = torch.zeros(40, 256), torch.zeros(40, 256)
    linear(x, w, None, "fp8", wgrad_into=eager).square().sum().backward()
    f = torch.compile(lambda x, w, buf: linear(x, w, None, "fp8", wgrad_into=buf), backend="aot_eager")
    f(x, w, compiled).square().sum().backward()
    assert torch.equal(compiled, eager) and w.grad is None


def test_bad_buffers_are_refused():
    w, x = torch.randn(40, 256), torch.randn(8, 256)
    for buf, match in [(torch.zeros(40, 256, dtype=torch.bfloat16), "float32"), (torch.zeros(256, 40), "shape"),
                       (torch.zeros(40, 256, requires_grad=True), "must not require grad"), ([0.0], "must be a tensor")]:
        with pytest.raises((ValueError, TypeError), match=match):
            linear(x, w, None, "fp8", wgrad_into=buf)


def test_snip_linear_uses_main_grad():
    torch.manual_seed(0)
    ref = SnipLinear(256, 40, precision="fp8")
    fused = SnipLinear(256, 40, precision="fp8", fuse_wgrad_accumulation=True)
    fused.load_state_dict(ref.state_dict())
    x = torch.randn(72, 256)
    with pytest.raises(RuntimeError, match="weight.main_grad"):
        fused(x)
    fused.weight.main_grad = torch.zeros(40, 256)
    for _ in range(2):
        ref(x).square().sum().backward()
        fused(x).square().sum().backward()
    assert fused.weight.grad is None and torch.equal(fused.weight.main_grad, ref.weight.grad)
    assert torch.equal(fused.bias.grad, ref.bias.grad)  # the bias keeps autograd's .grad
    assert "fuse_wgrad_accumulation=True" in repr(fused)
    bf16 = SnipLinear(256, 40, precision="bf16", fuse_wgrad_accumulation=True)
    bf16.weight.main_grad = torch.zeros(40, 256)
    bf16(x).sum().backward()
    assert bf16.weight.grad is None and torch.allclose(bf16.weight.main_grad, torch.ones(40, 72) @ x)


def test_convert_sets_the_option():
    model = torch.nn.Sequential(torch.nn.Linear(256, 40), torch.nn.ReLU(), torch.nn.Linear(40, 24))
    convert(model, "fp8", filter_fn=lambda m, n: True, fuse_wgrad_accumulation=True)
    assert all(m.fuse_wgrad_accumulation for m in model if isinstance(m, SnipLinear))
    convert(model, "fp4", filter_fn=lambda m, n: True)  # None: unchanged
    assert all(m.fuse_wgrad_accumulation for m in model if isinstance(m, SnipLinear))
    convert(model, filter_fn=lambda m, n: True, fuse_wgrad_accumulation=False)
    assert not any(m.fuse_wgrad_accumulation for m in model if isinstance(m, SnipLinear))
