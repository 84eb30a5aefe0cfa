"""The PyTorch reference divides by tensors, never by Python numbers (tests/cuda_division.py says why):
quantization, dequantization, GEMM emulation and the emulated linear layer must do no such division
and give the same bits under CUDA's scalar division."""

import pytest
import torch

import snip_ops
from cuda_division import CudaScalarDivision, bits
from snip_ops import gemm, reference
from snip_ops.formats import E2M1, E4M3, E5M2, RECIPES, QuantSpec, Rounding, ScaleKind

pytestmark = pytest.mark.usefixtures("one_thread")


def _data(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Gaussian values whose block maxima spread over many binades (many scale divisions to get wrong)."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-60, 60, (rows, 1), generator=g).float())
    return torch.randn(rows, cols, generator=g) * mag


def _kernel_specs():
    for elem in (E4M3, E5M2, E2M1):
        for block in ((1, 16), (1, 32), (1, 128), (16, 16), (128, 128)):
            for scale in (ScaleKind.FP32, ScaleKind.POW2, ScaleKind.E8M0):
                for rounding in (Rounding.RNE, Rounding.SR):
                    yield QuantSpec(elem, block, scale, rounding)
    for rounding in (Rounding.RNE, Rounding.SR):
        yield QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, rounding)


def _reference_outputs() -> list[torch.Tensor]:
    """Every reference computation whose result a kernel (or another device) must reproduce."""
    out = []
    x = _data(67, 300, 0)
    for spec in _kernel_specs():
        for transpose in (False, True):
            q = reference.quantize(x, spec, seed=5, offset=3, transpose=transpose)
            out += [q.codes, q.scales, reference.dequantize(q),
                    reference.fake_quantize(x, spec, seed=5, offset=3, transpose=transpose)]
            if q.tensor_scale is not None:
                out.append(q.tensor_scale)
    nvfp4 = QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4)
    for amax in _data(64, 1, 1).abs().flatten():  # one tensor scale per tensor: many tensors
        out.append(reference.quantize(x[:2, :32], nvfp4, tensor_amax=amax).tensor_scale)

    xa, w, dy = _data(37, 200, 2), _data(24, 200, 3) * 1e-2, _data(37, 24, 4)
    for name, r in RECIPES.items():
        if r.is_bf16:
            continue
        out += [gemm.fprop(xa, w, r, seed=1), gemm.dgrad(dy, w, r, seed=1), gemm.wgrad(dy, xa, r, seed=1)]
        xg, wg = xa.clone().requires_grad_(), w.clone().requires_grad_()
        y = snip_ops.linear(xg, wg, precision=name, emulate=True)
        y.backward(dy)
        out += [y, xg.grad, wg.grad]
    return out


def test_no_scalar_divisor_in_the_reference():
    with CudaScalarDivision() as mode:
        _reference_outputs()
    assert not mode.calls, "division by a Python number (CUDA computes it as a reciprocal multiply):\n" + "\n".join(
        sorted(set(mode.calls)))


def test_reference_bits_are_those_of_cuda_scalar_division():
    plain = _reference_outputs()
    with CudaScalarDivision():
        emulated = _reference_outputs()
    assert len(plain) == len(emulated)
    for i, (a, b) in enumerate(zip(plain, emulated)):
        assert torch.equal(bits(a), bits(b)), f"output {i} differs under CUDA's scalar division"


def test_the_mode_sees_scalar_division():
    """The check itself: a scalar divisor is recorded and gives CUDA's (different) bits."""
    v = torch.arange(1, 2001, dtype=torch.float32)
    with CudaScalarDivision() as mode:
        cuda_like = v / 448.0
    assert len(mode.calls) == 1 and "v / 448.0" in mode.calls[0]
    assert not torch.equal(cuda_like, v / 448.0)
    assert torch.equal(reference.divide_by(v, 448.0), v / 448.0)
