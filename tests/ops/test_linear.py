"""snip_ops.linear (reference path): bf16 equals F.linear, low-precision GEMMs equal the emulation on
dequantized operands, SQNR floors per format, shapes, dtypes and errors."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from bounds import assert_within_gemm_bound
from snip_ops import LinearPrecision, _ext, gemm, linear
from snip_ops.formats import recipe
from snip_ops.qparts import num_parts
from snip_ops.reference import fake_quantize

# SQNR floors in dB against the float32 result, for (forward, input grad, weight grad) on N(0,1) data:
# each is >= 7 standard deviations below its mean over data seeds 0-19 (the spread of the quantization
# error from draw to draw, sd <= 0.24 dB); a GEMM's summation order moves an SQNR by < 1e-4 dB.
SQNR_FLOORS = {
    "fp8": (29, 26, 26),
    "fp8_e5m2grad": (29, 22, 22),
    "mxfp8": (29, 26, 26),
    "nvfp4": (18, 13, 13),
    "mxfp4": (17, 12, 12),
    "fp4": (17, 12, 12),
}


def sqnr(actual, expected):
    return (10 * torch.log10(expected.pow(2).sum() / (actual.float() - expected).pow(2).sum())).item()


def _data(dtype=torch.float32, lead=(3, 41), k=300, n=190, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*lead, k, generator=g).to(dtype).requires_grad_()
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype).requires_grad_()
    b = torch.randn(n, generator=g).to(dtype).requires_grad_()
    dy = torch.randn(*lead, n, generator=g).to(dtype)
    return x, w, b, dy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bf16_path_is_f_linear(dtype):
    x, w, b, dy = _data(dtype)
    for precision in (None, "bf16", LinearPrecision("bf16")):
        y = linear(x, w, b, precision)
        grads = torch.autograd.grad(y, (x, w, b), dy)
        y0 = F.linear(x, w, b)
        grads0 = torch.autograd.grad(y0, (x, w, b), dy)
        assert torch.equal(y, y0)
        for g, g0 in zip(grads, grads0):
            assert torch.equal(g, g0)


@pytest.mark.parametrize("name", list(SQNR_FLOORS))
def test_low_precision_matches_emulation_and_sqnr_floor(name):
    x, w, b, dy = _data()
    y = linear(x, w, b, name, seed=7, offset=3)
    dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
    r = recipe(name)
    x2, dy2 = x.detach().reshape(-1, 300), dy.reshape(-1, 190)
    # against the emulation on dequantized operands: the same operands in the same FP32 matmul calls
    assert torch.equal(y.reshape(-1, 190), gemm.fprop(x2, w.detach(), r, 7, 3) + b.detach())
    assert torch.equal(dx.reshape(-1, 300), gemm.dgrad(dy2, w.detach(), r, 7, 3))
    assert torch.equal(dw, gemm.wgrad(dy2, x2, r, 7, 3))
    assert torch.equal(db, dy2.sum(0))
    # against an FP64 GEMM of the dequantized fprop operands: the FP32 GEMM's bound, then the bias add
    xq = fake_quantize(x2, r.act, seed=7, offset=3 * 8 + 0)
    wq = fake_quantize(w.detach(), r.weight, seed=7, offset=3 * 8 + 1)
    y64 = xq.double() @ wq.double().t() + b.detach().double()
    assert_within_gemm_bound(y.reshape(-1, 190), xq, wq, y64, rounded_to=(torch.float32,), what=name)
    # quality against the unquantized float32 result
    y0 = F.linear(x, w, b)
    dx0, dw0, _ = torch.autograd.grad(y0, (x, w, b), dy)
    floors = SQNR_FLOORS[name]
    assert sqnr(y, y0) >= floors[0] and sqnr(dx, dx0) >= floors[1] and sqnr(dw, dw0) >= floors[2]


def test_each_gemm_uses_its_own_precision():
    x, w, b, dy = _data()
    mixed = LinearPrecision(fprop="fp8", dgrad="fp4", wgrad="bf16")
    y = linear(x, w, None, mixed)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    fp8_y = linear(x, w, None, "fp8")
    assert torch.equal(y, fp8_y)
    dx_fp4, _ = torch.autograd.grad(linear(x, w, None, "fp4"), (x, w), dy)
    assert torch.equal(dx, dx_fp4)
    # bf16 recipe: the FP32 GEMM dy^T x of the unquantized operands
    x2, dy2 = x.detach().reshape(-1, 300), dy.reshape(-1, 190)
    assert_within_gemm_bound(dw, dy2.t(), x2.t(), what="wgrad")


def test_bf16_inputs_give_bf16_outputs_and_grads():
    x, w, b, dy = _data(torch.bfloat16)
    y = linear(x, w, b, "fp8")
    dx, dw, db = torch.autograd.grad(y, (x, w, b), dy)
    assert y.dtype == dx.dtype == dw.dtype == db.dtype == torch.bfloat16
    y0 = F.linear(x.float(), w.float(), b.float())
    assert sqnr(y, y0) > 25  # 31.6 +- 0.2 dB over data seeds 0-19
    assert torch.equal(db, dy.reshape(-1, dy.shape[-1]).float().sum(0).to(torch.bfloat16))  # FP32 sums, one rounding


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("emulate", [True, False])
def test_the_wgrad_gemm_writes_the_weights_dtype(dtype, emulate, monkeypatch):
    """The weight gradient leaves the wgrad GEMM in the weight's dtype (one rounding of its FP32 sum, no FP32
    [N, K] tensor written, read and cast): the bits of the FP32 product cast afterwards. Into wgrad_into it
    is added in FP32."""
    linear_mod = importlib.import_module("snip_ops.linear")  # the package's `linear` is the function
    asked = []
    real_gemm = linear_mod._gemm

    def recording(a, b, out_dtype, out=None):
        asked.append(out_dtype if out is None else ("into", out_dtype))
        return real_gemm(a, b, out_dtype, out)

    monkeypatch.setattr(linear_mod, "_gemm", recording)
    x, w, _, dy = _data(dtype)
    x2, dy2 = x.detach().reshape(-1, 300), dy.reshape(-1, 190)
    r = recipe("fp8")
    y = linear(x, w, None, "fp8", seed=7, offset=3, emulate=emulate)
    dx, dw = torch.autograd.grad(y, (x, w), dy)
    assert asked == [dtype, dtype, dtype] and dw.dtype == dtype
    assert torch.equal(dw, gemm.wgrad(dy2, x2, r, 7, 3, emulate=emulate).to(dtype))
    into = torch.zeros(190, 300)
    y = linear(x, w, None, "fp8", seed=7, offset=3, emulate=emulate, wgrad_into=into)
    y.backward(dy)
    assert asked[3:] == [dtype, dtype, ("into", torch.float32)]
    assert torch.equal(into, gemm.wgrad(dy2, x2, r, 7, 3, emulate=emulate))
    with pytest.raises(ValueError, match="must be asked for torch.float32"):  # no rounding before the addition
        real_gemm(dy2.t().float(), x2.t().float(), torch.bfloat16, into)


def test_sr_offsets_change_gradients_not_forward():
    x, w, b, dy = _data()
    outs = []
    for offset in (0, 1):
        y = linear(x, w, None, "fp4", seed=1, offset=offset)
        outs.append((y, *torch.autograd.grad(y, (x, w), dy)))
    assert torch.equal(outs[0][0], outs[1][0])  # activations and weights use RNE in fp4
    assert not torch.equal(outs[0][1], outs[1][1]) and not torch.equal(outs[0][2], outs[1][2])
    y = linear(x, w, None, "fp4", seed=1, offset=torch.tensor(1))
    assert torch.equal(torch.autograd.grad(y, (x, w), dy)[1], outs[1][2])


@pytest.mark.parametrize("emulate", [True, False])
def test_a_tensor_and_its_transpose_draw_the_same_bits(emulate, monkeypatch):
    """dgrad's dy and wgrad's dy^T round every element with the bits of (seed, 8n + 2), x and x^T with
    those of (seed, 8n + 0) (docs/design.md §2; the offsets are written out here, not read from
    gemm.OPERAND_IDS); the fused row + column pass gets one offset for both outputs."""
    linear_mod = importlib.import_module("snip_ops.linear")  # the package's `linear` is the function
    offsets = []
    real_rowcol = linear_mod.quantize_rowcol

    def recording(t, spec, *, seed, offset, offset_t, **kw):
        offsets.append((offset, offset_t))
        return real_rowcol(t, spec, seed=seed, offset=offset, offset_t=offset_t, **kw)

    monkeypatch.setattr(linear_mod, "quantize_rowcol", recording)
    x, w, _, dy = _data()
    x, dy = x.detach().reshape(-1, 300).requires_grad_(), dy.reshape(-1, 190)
    r, seed, n = recipe("fp4"), 7, 3
    y = linear(x, w, None, "fp4", seed=seed, offset=n, emulate=emulate)
    dx, dw = torch.autograd.grad(y, (x, w), dy)

    def q(t, spec, operand_id, transpose=False):
        return fake_quantize(t, spec, seed=seed, offset=8 * n + operand_id, transpose=transpose)

    assert torch.equal(dx, gemm.fp32_mm(q(dy, r.grad, 2), q(w, r.weight, 1)))
    assert torch.equal(dw, gemm.fp32_mm(q(dy, r.grad, 2, True), q(x, r.act, 0, True).t()))
    # dy^T's former own offset (8n + 4) gives other codes: the comparison above can tell them apart
    assert not torch.equal(q(dy, r.grad, 4, True), q(dy, r.grad, 2, True))
    if not emulate and _ext.kernel_available("quantize", "cpu"):
        assert offsets and all(o == o_t for o, o_t in offsets)


def test_shapes_1d_and_empty():
    w = torch.randn(8, 40)
    assert linear(torch.randn(40), w, None, "fp8").shape == (8,)
    assert linear(torch.randn(0, 40), w, None, "fp8").shape == (0, 8)
    assert linear(torch.randn(2, 3, 5, 40), w, None, "mxfp4").shape == (2, 3, 5, 8)


def test_no_grad_for_frozen_weight():
    x, w, b, dy = _data()
    w = w.detach()
    y = linear(x, w, None, "fp8")
    (dx,) = torch.autograd.grad(y, (x,), dy)
    assert dx.shape == x.shape


def test_bad_inputs():
    x, w = torch.randn(4, 16), torch.randn(8, 16)
    with pytest.raises(ValueError, match="last dimension"):
        linear(torch.randn(4, 15), w, None, "fp8")
    with pytest.raises(ValueError, match="2-D"):
        linear(x, torch.randn(8, 16, 1), None, "fp8")
    with pytest.raises(TypeError, match="same dtype"):
        linear(x, w.double().float().bfloat16(), None, "fp8")
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        linear(x.long(), w, None, "fp8")
    with pytest.raises(ValueError, match="b must have shape"):
        linear(x, w, torch.randn(7), "fp8")
    with pytest.raises(ValueError, match="unknown precision 'fp3'"):
        linear(x, w, None, "fp3")
    with pytest.raises(ValueError, match="unknown GEMM"):
        LinearPrecision.of({"forward": "fp8"})
    with pytest.raises(TypeError, match="recipe name"):
        LinearPrecision(3)
    if torch.device("meta") != x.device:
        with pytest.raises(ValueError, match="is on meta"):
            linear(x, w.to("meta"), None, "fp8")


def test_kernel_path_only_where_the_quantizer_op_exists():
    x = torch.randn(4, 8)
    assert gemm.uses_kernels(x, recipe("fp8")) == _ext.kernel_available("quantize", "cpu")
    assert not gemm.uses_kernels(x, recipe("fp8"), emulate=True)


@pytest.mark.parametrize("name", ["bf16", "fp8"])
def test_autocast_computes_in_its_dtype_like_f_linear(name):
    x, w, b, dy = _data()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = linear(x, w, b, name, seed=1, offset=2)
        y_ref = F.linear(x, w, b)
    assert y.dtype == y_ref.dtype == torch.bfloat16
    dx, dw, db = torch.autograd.grad(y, (x, w, b), dy.to(torch.bfloat16))
    assert dx.dtype == dw.dtype == db.dtype == torch.float32  # FP32 master weights get FP32 grads
    cast = [t.detach().to(torch.bfloat16) for t in (x, w, b)]
    torch.testing.assert_close(y, linear(*cast, name, seed=1, offset=2), rtol=0, atol=0)


MIXED = {
    "fp8": LinearPrecision(fprop="fp8", dgrad="fp8", wgrad="fp8"),
    "fp4": LinearPrecision(fprop="fp4", dgrad="fp4", wgrad="fp4"),
    "nvfp4": LinearPrecision(fprop="nvfp4", dgrad="nvfp4", wgrad="nvfp4"),
    "mxfp4_mxfp8": LinearPrecision(fprop="mxfp4", dgrad="mxfp8", wgrad="mxfp4"),
    "bf16_dgrad": LinearPrecision(fprop="fp8", dgrad="bf16", wgrad="fp4"),
    "bf16_wgrad_fprop": LinearPrecision(fprop="bf16", dgrad="fp8", wgrad="bf16"),
}


@pytest.mark.parametrize("name", list(MIXED))
def test_custom_ops_pass_opcheck(name):
    """Fake implementations (shapes, strides, dtypes of the saved operands) match the ops."""
    p = MIXED[name]
    x, w, dy = torch.randn(37, 300), torch.randn(190, 300), torch.randn(37, 190)
    seed, off = torch.tensor(3, dtype=torch.int64), torch.tensor(5, dtype=torch.int64)
    keys = (p.fprop.key(), p.dgrad.key(), p.wgrad.key())
    # emulated: one float32 tensor per saved operand; on the quantizer op (the CPU's where the
    # extension has it): the QTensor's parts
    for emulate in (True, False):
        kernels = not emulate and _ext.kernel_available("quantize", "cpu")
        for need_dx, need_dw in ((True, True), (False, True), (True, False)):
            fwd_args = (x, w, *keys, seed, off, emulate, need_dx, need_dw)
            torch.library.opcheck(torch.ops.snip.linear_fwd.default, fwd_args, test_utils=("test_faketensor",))
            _, *saved = torch.ops.snip.linear_fwd(*fwd_args)
            n_xt = (num_parts(p.wgrad.act) if kernels else 1) if need_dw and not p.wgrad.is_bf16 else 0
            x_keep = x if need_dw and p.wgrad.is_bf16 else None
            w_keep = w if need_dx and p.dgrad.is_bf16 else None
            bwd_args = (dy, x_keep, saved[:n_xt], w_keep, saved[n_xt:], 300, keys[1], keys[2], seed, off, emulate,
                        need_dx, need_dw)
            torch.library.opcheck(torch.ops.snip.linear_bwd.default, bwd_args, test_utils=("test_faketensor",))
            if need_dw:  # the weight gradient added into a buffer instead (fuse_wgrad_accumulation)
                acc_args = (*bwd_args[:-1], torch.zeros(190, 300))
                torch.library.opcheck(torch.ops.snip.linear_bwd_accumulate.default, acc_args,
                                      test_utils=("test_faketensor",))


def test_seeded_ops_are_the_same_ops_tagged_for_cuda_graphs():
    """Each op has a `_seeded` twin: the same schema and implementation, tagged cudagraph_unsafe."""
    x, w = torch.randn(37, 300), torch.randn(190, 300)
    args = (x, w, *(recipe("fp4").key(),) * 3, torch.tensor(3), torch.tensor(5), False, True, True)
    for name in ("linear_fwd", "linear_bwd", "linear_bwd_accumulate"):
        plain, seeded = getattr(torch.ops.snip, name).default, getattr(torch.ops.snip, f"{name}_seeded").default
        assert torch.Tag.cudagraph_unsafe in seeded.tags and torch.Tag.cudagraph_unsafe not in plain.tags
        assert str(seeded._schema) == str(plain._schema).replace(f"snip::{name}(", f"snip::{name}_seeded(", 1)
    got, want = torch.ops.snip.linear_fwd_seeded(*args), torch.ops.snip.linear_fwd(*args)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize(("precision", "seeded"), [
    ("fp8", (False, False)),
    ("fp4", (False, True)),  # round-to-nearest x and w, SR gradients
    ("nvfp4_train", (True, True)),  # x^T after the Hadamard transform, whose signs are drawn
    (LinearPrecision(fprop="fp8", dgrad="fp8", wgrad="mxfp4"), (False, True)),
    (LinearPrecision(fprop="bf16", dgrad="bf16", wgrad="bf16"), None),  # F.linear, no snip op
])
@pytest.mark.parametrize("accumulate", [False, True])
def test_layers_call_the_seeded_ops_where_they_draw_random_bits(precision, seeded, accumulate):
    """(forward, backward) call the `_seeded` ops exactly where their quantizations draw random bits, so
    that a CUDA graph never replays an SR offset (snip_ops.linear._register)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    called = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.namespace == "snip":
                called.append(func.__name__.split(".")[0])
            return func(*args, **(kwargs or {}))

    x, w = torch.randn(32, 128, requires_grad=True), torch.randn(64, 128, requires_grad=True)
    into = torch.zeros(64, 128) if accumulate else None
    with Log():
        y = linear(x, w, None, precision, emulate=True, wgrad_into=into)
        y.backward(torch.ones_like(y))
    if seeded is None:
        assert called == [] if not accumulate else called == ["linear_fwd", "linear_bwd_accumulate"]
        return
    bwd = "linear_bwd_accumulate" if accumulate else "linear_bwd"
    assert called == ["linear_fwd" + "_seeded" * seeded[0], bwd + "_seeded" * seeded[1]]


def test_weight_is_quantized_once_per_step(monkeypatch):
    """fp8 (128x128 weight blocks, round to nearest): w^T for dgrad reuses w's quantization; x and dy
    are quantized once per use (their transposes fused into the quantization)."""
    from snip_ops import reference

    calls = []
    real = reference.fake_quantize

    def counting(t, spec, **kw):
        calls.append((tuple(t.shape), kw.get("transpose", False)))
        return real(t, spec, **kw)

    monkeypatch.setattr(reference, "fake_quantize", counting)
    x = torch.randn(64, 256, requires_grad=True)
    w = torch.randn(128, 256, requires_grad=True)
    linear(x, w, None, "fp8", emulate=True).sum().backward()
    assert sorted(calls) == sorted([((64, 256), False), ((64, 256), True), ((128, 256), False),
                                    ((64, 128), False), ((64, 128), True)])
