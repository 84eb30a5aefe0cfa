"""Work that draws random bits refuses to run while a CUDA graph is captured: its Philox offsets are host
integers, which a graph would replay at every step. Round-to-nearest work is not refused.

On the CPU, capture is simulated by replacing `philox.capturing`; the GPU test captures for real."""

import pytest
import torch

from snip_ops import SnipLinear, _ext, philox, self_check
from snip_ops.formats import E2M1, E4M3, QuantSpec, Rounding, ScaleKind
from snip_ops.hadamard import rht_signs
from snip_ops.optim import AdamW
from snip_ops.quantize import fake_quantize, quantize, quantize_hadamard_t, quantize_rowcol

SR = QuantSpec(E4M3, (1, 128), ScaleKind.FP32, Rounding.SR)
RNE = QuantSpec(E4M3, (1, 128), ScaleKind.FP32, Rounding.RNE)
NVFP4_SR = QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR)


@pytest.fixture
def captured(monkeypatch):
    for kernel in self_check.CHECKS:  # the self-checks run first, outside the simulated capture
        _ext.kernel_available(kernel, torch.device("cpu"))
    monkeypatch.setattr(philox, "capturing", lambda t: True)


def test_not_capturing_on_the_cpu():
    assert not philox.capturing(torch.zeros(2))
    philox.refuse_capture(torch.zeros(2), "anything")


@pytest.mark.parametrize("call", [
    lambda x: quantize(x, SR, seed=1, offset=2),
    lambda x: quantize(x, SR, transpose=True),
    lambda x: quantize_rowcol(x, SR),
    lambda x: fake_quantize(x, SR),
    lambda x: quantize_hadamard_t(x, NVFP4_SR, rht_signs(0, 0)),
    lambda x: quantize_hadamard_t(x, QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.RNE), rht_signs(0, 0)),
], ids=["quantize", "quantize_t", "rowcol", "fake", "hadamard_sr", "hadamard_rne"])
def test_quantizations_that_draw_bits_are_refused(captured, call):
    with pytest.raises(RuntimeError, match="CUDA graph"):
        call(torch.randn(32, 256))


@pytest.mark.parametrize("call", [
    lambda x: quantize(x, RNE), lambda x: quantize_rowcol(x, RNE), lambda x: fake_quantize(x, RNE, transpose=True)])
def test_round_to_nearest_runs(captured, call):
    call(torch.randn(32, 256))


def _fwd_bwd(precision, emulate):
    torch.manual_seed(0)
    layer = SnipLinear(256, 128, dtype=torch.bfloat16, precision=precision, emulate=emulate)
    x = torch.randn(32, 256, dtype=torch.bfloat16, requires_grad=True)
    y = layer(x)
    return y, lambda: y.float().sum().backward()


@pytest.mark.parametrize("emulate", [False, True], ids=["kernel", "emulated"])
def test_layers_refuse_where_they_draw_bits(captured, emulate):
    y, backward = _fwd_bwd("fp8", emulate)  # round-to-nearest everywhere
    backward()
    y, backward = _fwd_bwd("fp4", emulate)  # round-to-nearest forward, stochastically rounded backward
    with pytest.raises(RuntimeError, match=r"snip::linear_bwd .*CUDA graph"):
        backward()
    with pytest.raises(RuntimeError, match=r"snip::linear_fwd .*CUDA graph"):
        _fwd_bwd("nvfp4_train", emulate)  # its forward quantizes with a random Hadamard transform's signs


@pytest.mark.parametrize("implementation", ["auto", "reference"])
def test_adamw_step_is_refused(captured, implementation):
    p = torch.nn.Parameter(torch.randn(64, dtype=torch.bfloat16))
    p.grad = torch.randn(64, dtype=torch.bfloat16)
    before = p.detach().clone()
    with pytest.raises(RuntimeError, match="outside the graph"):
        AdamW([p], lr=1e-3, implementation=implementation).step()
    assert torch.equal(p.detach(), before)  # refused before anything was written


def test_a_kernel_is_not_self_checked_inside_a_capture(monkeypatch):
    monkeypatch.setattr(philox, "stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="before capturing"):
        self_check.passed("quantize", "cuda:7")
    assert ("quantize", "cuda:7") not in self_check._results  # refused, not failed


@pytest.mark.gpu
def test_capture_on_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.randn(64, 256, device="cuda")
    quantize(x, SR)  # warm up outside the graph
    graph = torch.cuda.graph
    with pytest.raises(RuntimeError, match="CUDA graph"):
        with graph(torch.cuda.CUDAGraph()):
            quantize(x, SR)
    g = torch.cuda.CUDAGraph()
    quantize(x, RNE)
    with graph(g):
        q = quantize(x, RNE)
    g.replay()
    assert torch.equal(q.codes.view(torch.uint8), quantize(x, RNE).codes.view(torch.uint8))
