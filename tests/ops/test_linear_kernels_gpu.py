"""snip_ops.linear on the kernels (CUDA quantizer + qgemm) against the emulated path on the same GPU:
the quantized operands are bit-identical (checked first), so outputs and gradients differ only by the
GEMMs' arithmetic: each side within its GEMM path's error bound (tests/bounds.py) of the exact product
of those operands, then rounded alike. (A training run on the kernels: tests/train/test_train_kernels_gpu.py.)"""

import contextlib

import pytest
import torch

from bounds import assert_within, gemm_error_bound, qgemm_error_bound, then_rounded
from snip_ops import SnipLinear, _ext, gemm, gemm_kernels as gk, linear, quantize, reuse_quantized_weights
from snip_ops.formats import recipe

pytestmark = pytest.mark.gpu
DEV = "cuda"
RECIPES = ["fp8", "fp4", "mxfp8", "nvfp4", "mxfp4"]


@pytest.fixture(autouse=True)
def _needs_kernels():
    if not _ext.kernel_available("quantize", DEV):
        pytest.skip(f"quantize not compiled for this GPU: {_ext.build_info()}")


def operand(t, spec, seed, offset, name, transpose=False):
    """(the CUDA quantizer's QTensor, the emulation's float32 values) of operand `name`, checked equal."""
    q = quantize(t, spec, seed=seed, offset=gemm.operand_offset(offset, name), transpose=transpose)
    values = gemm.emulated_operand(t, spec, seed, offset, name, transpose)
    assert torch.equal(q.dequantize(), values), f"operand {name}: the CUDA quantizer differs from the reference"
    return q, values


def assert_paths_agree(got, want, a, b, out_dtype, result_dtype, bias=None, what=""):
    """got (kernel path) and want (emulation) both compute a . b^T of the QTensors a, b as a GEMM with
    output `out_dtype`, then cast to `result_dtype`: the kernel within its qgemm path's bound (BF16 out
    of the sm100 kernels), the emulation an FP64 GEMM rounded to FP32; with a bias, the bias added in
    `result_dtype`."""
    path = gk.select_path(a, b, out_dtype=out_dtype).path
    da, db = a.dequantize(), b.dequantize()
    ref = da.double() @ db.double().t()
    kernel_dtype = torch.bfloat16 if path.startswith("sm100_") else torch.float32
    kernel = then_rounded(qgemm_error_bound(path, da, db), ref, kernel_dtype, out_dtype, result_dtype)
    emulated = then_rounded(gemm_error_bound(da, db, torch.float64), ref, torch.float32, out_dtype, result_dtype)
    if bias is not None:
        ref = ref + bias.double()
        kernel, emulated = then_rounded(kernel, ref, result_dtype), then_rounded(emulated, ref, result_dtype)
    assert_within(got, want, kernel + emulated, f"{what} ({path})")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", RECIPES)
@pytest.mark.parametrize("shape", [(3, 77, 300, 190), (1, 256, 512, 384), (2, 129, 4096, 1000)])
def test_kernel_path_matches_emulation(name, shape, dtype):
    b_, s_, k, n = shape
    gen = torch.Generator(device=DEV).manual_seed(0)
    x = torch.randn(b_, s_, k, device=DEV, generator=gen).to(dtype).requires_grad_()
    w = (torch.randn(n, k, device=DEV, generator=gen) / k**0.5).to(dtype).requires_grad_()
    bias = torch.randn(n, device=DEV, generator=gen).to(dtype).requires_grad_()
    dy = torch.randn(b_, s_, n, device=DEV, generator=gen).to(dtype)
    r = recipe(name)
    assert gemm.uses_kernels(x, r)
    outs = []
    for emulate in (False, True):
        y = linear(x, w, bias, name, seed=5, offset=9, emulate=emulate)
        outs.append((y, *torch.autograd.grad(y, (x, w, bias), dy)))
    for got, want in zip(*outs):
        assert got.dtype == want.dtype and got.shape == want.shape
    (y, dx, dw, db), (y_e, dx_e, dw_e, db_e) = outs
    x2, dy2, w_ = x.detach().reshape(-1, k), dy.reshape(-1, n), w.detach()
    xq, _ = operand(x2, r.act, 5, 9, "x")
    wq, _ = operand(w_, r.weight, 5, 9, "w")
    dyq, _ = operand(dy2, r.grad, 5, 9, "dy")
    wtq, _ = operand(w_, r.weight, 5, 9, "wt", transpose=True)
    dytq, _ = operand(dy2, r.grad, 5, 9, "dyt", transpose=True)
    xtq, _ = operand(x2, r.act, 5, 9, "xt", transpose=True)
    assert_paths_agree(y.reshape(-1, n), y_e.reshape(-1, n), xq, wq, dtype, dtype, bias.detach(), "fprop")
    assert_paths_agree(dx.reshape(-1, k), dx_e.reshape(-1, k), dyq, wtq, dtype, dtype, what="dgrad")
    assert_paths_agree(dw, dw_e, dytq, xtq, dtype, dtype, what="wgrad")  # w's dtype, from the GEMM
    assert torch.equal(db, db_e)  # the same reduction of the same dy


def test_each_operand_is_quantized_once_and_backward_keeps_codes(monkeypatch):
    """fp8: x, dy and the weight each in one fused row+column pass (w^T for dgrad straight from the
    quantizer, no transpose of codes); backward keeps FP8 codes of x^T, not the activations."""
    import importlib

    lin = importlib.import_module("snip_ops.linear")
    calls = []
    for fn in ("quantize", "quantize_rowcol"):
        real = getattr(lin, fn)
        monkeypatch.setattr(lin, fn, lambda *a, _real=real, _fn=fn, **k: calls.append((_fn, tuple(a[0].shape)))
                            or _real(*a, **k))
    x = torch.randn(64, 256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(128, 256, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        y = linear(x, w, None, "fp8")
    y.float().sum().backward()
    assert sorted(calls) == [("quantize_rowcol", (64, 128)), ("quantize_rowcol", (64, 256)), ("quantize_rowcol", (128, 256))]
    assert not any(t.dtype == torch.bfloat16 and t.numel() >= x.numel() for t in saved)
    assert any(t.dtype == torch.float8_e4m3fn and t.shape == (256, 64) for t in saved)


@pytest.mark.parametrize("precision", ["fp8", "fp4", "fp8_e5m2grad"])
def test_fused_wgrad_accumulation_on_the_kernels(precision):
    # The wgrad GEMM's epilogue adds into main_grad (beta = 1): acc1, then RN(acc1 + acc2), which is what
    # autograd's FP32 w.grad accumulation of the kernel's FP32 outputs computes too.
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(520, 1024, device="cuda", generator=g).requires_grad_()
    xs = [torch.randn(768, 1024, device="cuda", generator=g) for _ in range(2)]
    main_grad = torch.zeros(520, 1024, device="cuda")
    for i, x in enumerate(xs):
        linear(x, w, None, precision, offset=i).square().sum().backward()
        linear(x, w.detach().requires_grad_(), None, precision, offset=i,
               wgrad_into=main_grad).square().sum().backward()
    assert torch.equal(main_grad, w.grad)


@pytest.mark.parametrize("precision", ["fp8", "fp4", "fp8_e5m2grad", "mxfp8", "nvfp4"])
def test_reused_weight_operands_give_the_same_bits_on_the_kernels(precision):
    # The kept operands are in their GEMMs' scale layouts (Hopper's MN-major FP32 scales, Blackwell's atoms)
    # and the GEMMs are deterministic: three micro-batches with and without reuse agree bit for bit.
    torch.manual_seed(0)
    m = SnipLinear(1024, 520, device=DEV, dtype=torch.bfloat16, precision=precision, seed=3)
    xs = [torch.randn(768, 1024, device=DEV, dtype=torch.bfloat16).requires_grad_() for _ in range(3)]

    def step(reuse):
        m.sr_step.zero_()
        m.weight.grad = m.bias.grad = None
        outs = []
        with reuse_quantized_weights(m) if reuse else contextlib.nullcontext():
            for x in xs:
                x.grad = None
                y = m(x)
                y.float().square().sum().backward()
                outs += [y.detach(), x.grad.clone()]
        return outs + [m.weight.grad.clone(), m.bias.grad.clone()]

    for got, want in zip(step(True), step(False)):
        assert torch.equal(got, want)
