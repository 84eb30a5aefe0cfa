"""snip_ops.reuse_quantized_weights: each weight quantized once across the micro-batches of a step, with results
bit for bit those of quantizing it in every forward; a weight that changes inside the context is refused."""

import contextlib
import dataclasses
import importlib

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import snip_ops
from snip_ops import LinearPrecision, SnipLinear, reuse_quantized_weights
from snip_ops.formats import RECIPES
from snip_ops.optim import AdamW

linear_module = importlib.import_module("snip_ops.linear")  # the package's `linear` is the function
PRECISIONS = [name for name in RECIPES if name != "bf16"] + [
    {"fprop": "fp8", "dgrad": "fp4", "wgrad": "fp4"},  # w and w^T in different formats
    {"fprop": "fp8", "dgrad": "bf16", "wgrad": "fp8"},  # no w^T operand: dgrad reads the weight itself
]


def _layer(precision, emulate, dtype=torch.bfloat16, bias=True):
    torch.manual_seed(0)
    return SnipLinear(256, 160, bias=bias, dtype=dtype, precision=precision, emulate=emulate, name="blk.proj")


def _micro_batches(dtype=torch.bfloat16, n=3):
    gen = torch.Generator().manual_seed(1)
    return [torch.randn(48, 256, generator=gen).to(dtype).requires_grad_() for _ in range(n)]


def _step(m, xs, reuse, autocast=False):
    """Forward + backward of every micro-batch, gradients accumulated: [(y, dx)], w.grad, b.grad."""
    m.sr_step.zero_()
    for p in m.parameters():
        p.grad = None
    outs = []
    with reuse_quantized_weights(m) if reuse else contextlib.nullcontext():
        for x in xs:
            x.grad = None
            with torch.autocast("cpu", torch.bfloat16) if autocast else contextlib.nullcontext():
                y = m(x)
            (y.float() ** 2).sum().backward()
            outs.append((y.detach(), x.grad.clone()))
    return outs, m.weight.grad.clone(), None if m.bias is None else m.bias.grad.clone()


def _same_bits(a, b):
    outs_a, dw_a, db_a = a
    outs_b, dw_b, db_b = b
    for (ya, dxa), (yb, dxb) in zip(outs_a, outs_b):
        assert torch.equal(ya, yb) and torch.equal(dxa, dxb)
    assert torch.equal(dw_a, dw_b)
    assert (db_a is None) == (db_b is None) and (db_a is None or torch.equal(db_a, db_b))


@pytest.fixture
def weight_quantizations(monkeypatch):
    """How often a layer quantized its weight: calls of the function both the op and the context use."""
    calls = []
    real = linear_module._weight_operands

    def counting(w, parts, *args):
        calls.append(tuple(w.shape) if w is not None else None)
        return real(w, parts, *args)

    monkeypatch.setattr(linear_module, "_weight_operands", counting)
    return calls


@pytest.mark.parametrize("emulate", [False, True])
@pytest.mark.parametrize("precision", PRECISIONS, ids=str)
def test_results_are_bit_for_bit_those_without_reuse(precision, emulate, weight_quantizations):
    m = _layer(precision, emulate)
    xs = _micro_batches()
    without = _step(m, xs, reuse=False)
    assert len(weight_quantizations) == 3
    weight_quantizations.clear()
    _same_bits(_step(m, xs, reuse=True), without)
    assert weight_quantizations == [(160, 256)]  # once, for three micro-batches


def test_under_autocast_the_cast_weight_is_the_one_kept(weight_quantizations):
    m = _layer("fp8", emulate=False, dtype=torch.float32)
    xs = _micro_batches(torch.float32)
    without = _step(m, xs, reuse=False, autocast=True)
    _same_bits(_step(m, xs, reuse=True, autocast=True), without)
    assert weight_quantizations[3:] == [(160, 256)]


def test_stochastically_rounded_or_bf16_weights_are_quantized_per_call(weight_quantizations):
    fp8 = LinearPrecision("fp8").fprop
    sr_weight = dataclasses.replace(fp8, name="fp8_sr_weight", weight=fp8.weight.with_rounding("sr"))
    for precision in (LinearPrecision(fprop=sr_weight, dgrad="fp8", wgrad="fp8"),
                      {"fprop": "bf16", "dgrad": "fp8", "wgrad": "fp8"}):
        assert not linear_module.weight_operands_reusable(LinearPrecision.of(precision))
        m = _layer(precision, emulate=False)
        xs = _micro_batches()
        weight_quantizations.clear()
        _same_bits(_step(m, xs, reuse=True), _step(m, xs, reuse=False))
        assert len(weight_quantizations) == 6  # every forward of both runs
    with pytest.raises(ValueError, match="cannot be reused"):
        linear_module.weight_operands(m.weight, LinearPrecision.of({"fprop": "bf16", "dgrad": "fp8", "wgrad": "fp8"}))


def test_activation_checkpointing_recomputes_with_the_kept_weight(weight_quantizations):
    m = _layer("fp8", emulate=False)
    xs = _micro_batches()

    def step(reuse):
        m.weight.grad = m.bias.grad = None
        outs = []
        with reuse_quantized_weights(m) if reuse else contextlib.nullcontext():
            for x in xs:
                x.grad = None
                checkpoint(m, x, use_reentrant=False).float().square().sum().backward()
                outs.append(x.grad.clone())
        return outs, m.weight.grad.clone()

    dx0, dw0 = step(False)
    weight_quantizations.clear()
    dx1, dw1 = step(True)
    assert all(torch.equal(a, b) for a, b in zip(dx0, dx1)) and torch.equal(dw0, dw1)
    assert weight_quantizations == [(160, 256)]  # six forwards (three recomputed), one quantization


def test_a_weight_changed_inside_the_context_is_refused():
    m = _layer("fp8", emulate=False)
    x = _micro_batches(n=1)[0]
    with reuse_quantized_weights(m):
        m(x).sum().backward()
        with torch.no_grad():
            m.weight.mul_(0.5)
        with pytest.raises(RuntimeError, match=r"'blk.proj'.*changed inside reuse_quantized_weights"):
            m(x)


@pytest.mark.parametrize("optimizer", [
    lambda p: torch.optim.AdamW(p, lr=0.1),
    lambda p: torch.optim.AdamW(p, lr=0.1, foreach=False),
    lambda p: AdamW(p, lr=0.1),                           # snip's: the extension's kernel where built
    lambda p: AdamW(p, lr=0.1, implementation="reference"),
], ids=["torch-foreach", "torch-for-loop", "snip", "snip-reference"])
def test_an_optimizer_step_inside_the_context_is_refused(optimizer):
    m = _layer("fp8", emulate=False)
    opt = optimizer(m.parameters())
    x = _micro_batches(n=1)[0]
    with reuse_quantized_weights(m):
        m(x).float().sum().backward()
        opt.step()
        with pytest.raises(RuntimeError, match="changed inside reuse_quantized_weights"):
            m(x)
    m(x)  # outside, the new weight is quantized as usual


def test_a_new_weight_precision_or_dtype_is_quantized_anew(weight_quantizations):
    m = _layer("fp8", emulate=False)
    x = _micro_batches(n=1)[0]
    fresh = lambda: snip_ops.linear(x, m.weight, m.bias, "fp4")  # noqa: E731  (fp4's forward draws no bits)
    with reuse_quantized_weights(m):
        m(x)
        m.set_precision("fp4")
        assert torch.equal(m(x), fresh())
        m.weight = nn.Parameter(m.weight.detach() * 2)
        assert torch.equal(m(x), fresh())
        m.weight, m.bias = nn.Parameter(m.weight.detach().float()), nn.Parameter(m.bias.detach().float())
        m(x.detach().float())
    # the layer's four forwards quantized anew each time, as did the two fresh calls
    assert len(weight_quantizations) == 6


def test_leaving_the_context_drops_the_kept_operands():
    model = nn.Sequential(_layer("fp8", emulate=False), nn.ReLU(),
                          SnipLinear(160, 256, dtype=torch.bfloat16, precision="fp8", name="out"))
    with reuse_quantized_weights(model) as inside:
        assert inside is model
        model(_micro_batches(n=1)[0])
        kept = [m.weight_reuse for m in (model[0], model[2])]
        assert all(k is not None and k._operands is not None for k in kept)
    assert model[0].weight_reuse is None and model[2].weight_reuse is None
    with pytest.raises(RuntimeError, match="boom"), reuse_quantized_weights(model):
        raise RuntimeError("boom")
    assert model[0].weight_reuse is None


def test_bad_uses_are_refused(monkeypatch):
    m = _layer("fp8", emulate=False)
    with pytest.raises(TypeError, match="nn.Module"):
        with reuse_quantized_weights("model"):
            pass  # not reached: entering the context raises
    with reuse_quantized_weights(m):
        with pytest.raises(RuntimeError, match="already inside"):
            with reuse_quantized_weights(m):
                pass  # not reached: entering the context raises
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        with pytest.raises(RuntimeError, match="eager only"):
            m(_micro_batches(n=1)[0])


def test_dtensor_weights_are_refused(monkeypatch):
    m = _layer("fp8", emulate=False)
    monkeypatch.setattr(snip_ops.weight_reuse, "_is_dtensor", lambda t: True)  # stands in: any weight is sharded
    with pytest.raises(ValueError, match="DTensor"):
        with reuse_quantized_weights(m):
            pass  # not reached: entering the context raises


def test_the_op_checks_the_reused_operand():
    w, x = torch.randn(160, 256), torch.randn(48, 256)
    w_parts, _ = linear_module.weight_operands(w, LinearPrecision("fp8"))
    off = torch.tensor(0)
    fp8 = LinearPrecision("fp8").fprop.key()
    y, *saved = torch.ops.snip.linear_fwd(x, None, fp8, fp8, fp8, off, off, False, True, True, w_operand=w_parts)
    assert torch.equal(y, torch.ops.snip.linear_fwd(x, w, fp8, fp8, fp8, off, off, False, True, True)[0])
    assert len(saved) == len(w_parts)  # x^T only: w^T is the caller's
    with pytest.raises(ValueError, match="w_operand has 1 tensors"):
        torch.ops.snip.linear_fwd(x, None, fp8, fp8, fp8, off, off, False, True, True, w_operand=w_parts[:1])
