"""The PyTorch reference divides by tensors, never by Python numbers.

CUDA computes `tensor / python_number` as `tensor * float32(1 / number)`, one ulp off the true
quotient for some inputs: a reference that divided by a Python number would, on a GPU, disagree with
the kernels (and with itself on the CPU). `CudaScalarDivision` makes the CPU compute such divisions
the CUDA way and records each; the reference paths (quantization, GEMM emulation, the emulated linear
layer, the planner's error estimates and Adam preconditioner) must record none and give the same bits
with and without it.
"""

from __future__ import annotations

import math
import traceback

import numpy as np
import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import snip_ops
from planner.qerror import gemm_errors
from planner.stats import LayerRecording, adam_preconditioner
from snip_ops import gemm, reference
from snip_ops.formats import GEMMS, RECIPES, E2M1, E4M3, E5M2, QuantSpec, Rounding, ScaleKind

pytestmark = pytest.mark.usefixtures("one_thread")

_DIVISIONS = {"__truediv__", "__itruediv__", "div", "div_", "divide", "divide_", "true_divide", "true_divide_"}


def _exact_reciprocal(b: float) -> bool:
    """Division by a power of two equals multiplication by its (exact) reciprocal."""
    return b != 0 and math.frexp(abs(b))[0] == 0.5 and 2.0**-126 <= abs(b) <= 2.0**126


class CudaScalarDivision(TorchFunctionMode):
    """`tensor / number` computed as CUDA computes it (times the float32 reciprocal); `calls` lists
    the source lines of those whose divisor is not a power of two."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        divisor = args[1] if len(args) > 1 else kwargs.get("other")
        if (getattr(func, "__name__", "") in _DIVISIONS and isinstance(args[0], torch.Tensor)
                and args[0].is_floating_point() and isinstance(divisor, (int, float, np.number))
                and not isinstance(divisor, bool) and kwargs.get("rounding_mode") is None):
            a = args[0]
            if not _exact_reciprocal(float(divisor)):
                frame = traceback.extract_stack(limit=2)[0]
                self.calls.append(f"{frame.filename}:{frame.lineno}: {frame.line}")
            inv = np.float32(1.0) / np.float32(divisor)  # CUDA: opmath_t(1) / b, in float32
            out = (a.float() * torch.tensor(float(inv), dtype=torch.float32)).to(a.dtype)
            return a.copy_(out) if func.__name__.endswith("_") or func.__name__ == "__itruediv__" else out
        return func(*args, **kwargs)


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


def _trained_adamw() -> torch.optim.AdamW:
    """An AdamW with state (torch's own optimizer code is not under test: built outside the mode)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 30), nn.Linear(30, 5))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
    for _ in range(3):
        model(_data(8, 20, 5)).square().mean().backward()
        opt.step()
    return opt


def _reference_outputs(opt: torch.optim.AdamW) -> list[torch.Tensor]:
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

    rec = LayerRecording(shape=None, x=xa, dy=dy, weight=w, out_rms=1.0, grad_out_rms=1.0, weight_grad=w)
    for errors in gemm_errors(rec, ("fp8", "fp4", "nvfp4", "mxfp4"), seed=2).values():
        out.append(torch.tensor([errors[g] for g in GEMMS], dtype=torch.float64))

    params = opt.param_groups[0]["params"]
    g = torch.Generator().manual_seed(6)
    pre = adam_preconditioner(opt, {p: torch.randn(p.shape, generator=g) for p in params})
    out += [pre.scale[p] for p in params]
    return out


def _bits(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in (torch.float32, torch.float64):
        return t.view(torch.int32 if t.dtype == torch.float32 else torch.int64)
    return t.view(torch.uint8) if t.element_size() == 1 else t


def test_no_scalar_divisor_in_the_reference():
    opt = _trained_adamw()
    with CudaScalarDivision() as mode:
        _reference_outputs(opt)
    assert not mode.calls, "division by a Python number (CUDA computes it as a reciprocal multiply):\n" + "\n".join(
        sorted(set(mode.calls)))


def test_reference_bits_are_those_of_cuda_scalar_division():
    opt = _trained_adamw()
    plain = _reference_outputs(opt)
    with CudaScalarDivision():
        emulated = _reference_outputs(opt)
    assert len(plain) == len(emulated)
    for i, (a, b) in enumerate(zip(plain, emulated)):
        assert torch.equal(_bits(a), _bits(b)), f"output {i} differs under CUDA's scalar division"


def test_the_mode_sees_scalar_division():
    """The check itself: a scalar divisor is recorded and gives CUDA's (different) bits."""
    v = torch.arange(1, 2001, dtype=torch.float32)
    with CudaScalarDivision() as mode:
        cuda_like = v / 448.0
    assert len(mode.calls) == 1 and "v / 448.0" in mode.calls[0]
    assert not torch.equal(cuda_like, v / 448.0)
    assert torch.equal(reference.divide_by(v, 448.0), v / 448.0)
