"""torch.compile(fullgraph=True) traces converted models: custom ops with fake implementations,
no graph breaks, and the compiled model computes what the eager one does."""

import torch
from torch import nn

from snip_ops import LinearPrecision, convert, linear


def _pair(precision):
    torch.manual_seed(0)
    eager = convert(nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 40)), precision)
    torch.manual_seed(0)
    compiled = convert(nn.Sequential(nn.Linear(48, 64), nn.ReLU(), nn.Linear(64, 40)), precision)
    return eager, compiled


def test_fullgraph_forward_backward_matches_eager():
    torch._dynamo.reset()
    precision = LinearPrecision(fprop="fp8", dgrad="fp4", wgrad="mxfp8")
    eager, model = _pair(precision)
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(5, 7, 48)
    for _ in range(2):  # the SR offset changes every step: no recompilation, same numbers as eager
        ye, yc = eager(x), compiled(x)
        assert torch.equal(ye, yc)
        ge = torch.autograd.grad(ye.square().sum(), list(eager.parameters()))
        gc = torch.autograd.grad(yc.square().sum(), list(model.parameters()))
        for a, b in zip(ge, gc):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
    assert int(model[0].sr_step) == int(eager[0].sr_step) == 2


def test_functional_linear_compiles_without_graph_breaks():
    torch._dynamo.reset()
    w = torch.randn(16, 32, requires_grad=True)

    def f(x, offset):
        return linear(x, w, None, "fp4", seed=3, offset=offset)

    explanation = torch._dynamo.explain(f)(torch.randn(4, 32), torch.tensor(1))
    assert explanation.graph_break_count == 0
    compiled = torch.compile(f, fullgraph=True)
    x = torch.randn(4, 32)
    assert torch.equal(compiled(x, torch.tensor(2)), f(x, torch.tensor(2)))
