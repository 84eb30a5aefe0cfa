"""Low-precision FSDP2 all-gather of SnipLinear weights (snip_ops.fsdp).

On one process: the op consumes a pre-quantized weight bit for bit like its own quantization, and the
wrappers behave. On 2 gloo CPU ranks (one spawn for all scenarios): training under fully_shard with
quantized all-gathers matches the full-precision gather + quantize-after-gather path bit for bit
(losses and weights, over a plan change), the gathered layouts and byte counts are what the layers'
precisions call for, and a layer whose shards would split a block falls back with one warning.
"""

import math
import warnings

import pytest
import torch
import torch.distributed as dist
from torch import nn

import snip_ops
from gloo import WORLD, run_on_ranks
from snip_ops.formats import E2M1, GemmRecipe, LinearPrecision, QuantSpec, Rounding, ScaleKind, recipe
from snip_ops.fsdp import GatheredWeight, ShardedWeight, enable_low_precision_all_gather, gathered_specs

pytestmark = pytest.mark.usefixtures("one_thread")

# NVFP4 with 16x16 weight blocks (square, so w^T shares w's quantization) and its FP32 tensor scale.
NVFP4_16 = GemmRecipe(
    "nvfp4_16x16", act=QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4), weight=QuantSpec(E2M1, (16, 16), ScaleKind.NVFP4),
    grad=QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR), speedup=4.0)
FP8_FP4 = LinearPrecision(fprop="fp8", dgrad="fp4", wgrad="fp4")  # two weight quantizations to gather


# ---- one process ------------------------------------------------------------------------------


def test_gathered_specs_follow_the_weight_recipes():
    assert gathered_specs(LinearPrecision("fp8")) == (recipe("fp8").weight,)
    assert gathered_specs(LinearPrecision(NVFP4_16)) == (NVFP4_16.weight,)
    assert gathered_specs(FP8_FP4) == (recipe("fp8").weight, recipe("fp4").weight)
    for full in ("bf16", "mxfp8", "nvfp4", "mxfp4", LinearPrecision(fprop="fp8", dgrad="bf16", wgrad="fp8")):
        assert gathered_specs(LinearPrecision.of(full)) is None, full


def _gathered(w: torch.Tensor, precision: LinearPrecision) -> GatheredWeight:
    """w as a quantized all-gather of one rank holding all of it delivers it."""
    qs = tuple(snip_ops.quantize(w.detach(), s) for s in gathered_specs(precision))
    return GatheredWeight(qs, tuple(w.shape), w.dtype, w.device, requires_grad=True)


@pytest.mark.parametrize("precision", [LinearPrecision("fp8"), LinearPrecision("fp4"), LinearPrecision(NVFP4_16),
                                       FP8_FP4])
@pytest.mark.parametrize("emulate", [False, True])
def test_prequantized_weight_is_bit_identical(precision, emulate):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(12, 160, generator=gen, requires_grad=True)
    w = torch.randn(144, 160, generator=gen, requires_grad=True)  # odd block counts and padded blocks
    gw = _gathered(w, precision)
    outs = []
    for weight in (w, gw):
        y = snip_ops.linear(x, weight, None, precision, seed=3, offset=5, emulate=emulate)
        dx, dw = torch.autograd.grad(y.pow(2).sum(), (x, weight))
        outs.append((y, dx, dw))
    for a, b in zip(*outs):
        assert type(b) is torch.Tensor and torch.equal(a, b)


def test_quantized_gathered_weight_refuses_other_uses():
    w = torch.randn(128, 128)
    gw = _gathered(w, LinearPrecision("fp8"))
    with pytest.raises(RuntimeError, match="all-gathered quantized"):
        gw + 1
    with pytest.raises(RuntimeError, match="now quantizes it as"):
        snip_ops.linear(torch.randn(4, 128), gw, None, "fp4")
    assert torch.zeros_like(gw).shape == w.shape and isinstance(gw.detach(), GatheredWeight)
    full = GatheredWeight(w, (128, 128), w.dtype, w.device)
    assert torch.equal(full + 1, w + 1)


def test_op_rejects_a_prequantized_weight_it_cannot_use():
    x, w = torch.randn(4, 128), torch.randn(128, 128)
    parts = snip_ops.qparts.to_parts(snip_ops.quantize(w, recipe("fp8").weight))
    off = torch.tensor(0)
    mx = recipe("mxfp8").key()
    with pytest.raises(ValueError, match="square round-to-nearest"):
        torch.ops.snip.linear_fwd(x, None, mx, mx, mx, off, off, False, True, True, wq=parts)
    fp4 = recipe("fp4").key()
    with pytest.raises(ValueError, match="parts"):
        torch.ops.snip.linear_fwd(x, None, fp4, recipe("fp8").key(), fp4, off, off, False, True, True, wq=parts)


def test_enable_wraps_snip_weights_and_leaves_training_unchanged():
    torch.manual_seed(0)
    ref = snip_ops.convert(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), "fp8")
    model = snip_ops.convert(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), "fp8")
    model.load_state_dict(ref.state_dict())
    assert enable_low_precision_all_gather(model) is model
    enable_low_precision_all_gather(model)  # again: nothing to do
    assert all(isinstance(m.weight, ShardedWeight) for m in (model[0], model[2]))
    assert model.state_dict().keys() == ref.state_dict().keys()
    x = torch.randn(5, 16)
    for m in (ref, model):
        opt = torch.optim.AdamW(m.parameters(), lr=0.1)
        m(x).pow(2).mean().backward()
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), model.state_dict().values()))
    with pytest.raises(TypeError, match="nn.Module"):
        enable_low_precision_all_gather("model")


# ---- two gloo ranks ---------------------------------------------------------------------------

# name: (layer widths, initial plan, emulate, FSDP param dtype, precision changes before step 2)
SCENARIOS = {
    "fp8": ((256, 256, 256, 97), "fp8", False, None, {"0": "fp4", "2": "bf16"}),
    "fp4": ((256, 256, 256, 96), "fp4", True, None, {"0": FP8_FP4, "2": "mxfp8"}),
    "nvfp4": ((256, 256, 256, 96), LinearPrecision(NVFP4_16), False, torch.bfloat16, {"2": "bf16"}),
}
STEPS, CHANGE_AT = 4, 2


def _layout(precision: LinearPrecision, rows: int) -> tuple | str:
    """What the quantized all-gather should carry for a layer: its specs, or "full"."""
    specs = gathered_specs(precision)
    if specs is None or rows % WORLD or any((rows // WORLD) % s.block[0] for s in specs):
        return "full"
    return tuple(s.describe() for s in specs)


def _bytes_per_gather(layout, rows: int, cols: int, dtype: torch.dtype) -> int:
    """Bytes one rank contributes to one all-gather of a layer (weight + bias)."""
    shard = -(-rows // WORLD)
    bias = shard * dtype.itemsize
    if layout == "full":
        return shard * cols * dtype.itemsize + bias
    total = bias
    for text in layout:
        spec = QuantSpec.parse(text)
        br, bc = spec.block
        total += shard * math.ceil(cols * spec.element.bits / 8)
        total += (shard // br) * -(-cols // bc) * (4 if spec.scale in (ScaleKind.FP32, ScaleKind.POW2) else 1)
    return total


def _train(rank: int, name: str, low_precision: bool) -> dict:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    widths, plan, emulate, param_dtype, changes = SCENARIOS[name]
    torch.manual_seed(0)
    layers = [nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:])]
    model = snip_ops.convert(nn.Sequential(layers[0], nn.ReLU(), layers[1], nn.ReLU(), layers[2]), plan,
                             emulate=emulate)
    if low_precision:
        enable_low_precision_all_gather(model)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype)
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    seen = []  # per forward of each layer: the layout of the weight it computes with
    for m in model:
        if isinstance(m, nn.Linear):
            m.register_forward_pre_hook(lambda mod, args: seen.append(
                "full" if not isinstance(mod.weight, GatheredWeight) or mod.weight.quantized is None
                else tuple(q.spec.describe() for q in mod.weight.quantized)))
    gathered = [0]
    all_gather_single = dist.all_gather_single

    def counting(output, input, *args, **kwargs):
        gathered[0] += input.numel() * input.element_size()
        return all_gather_single(output, input, *args, **kwargs)

    dist.all_gather_single = counting
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(10 + rank)
    losses, step_bytes, expected = [], [], []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(STEPS):
                if step == CHANGE_AT:
                    for key, precision in changes.items():
                        model.get_submodule(key).set_precision(precision)
                expected.append([_layout(m.precision, m.out_features) for m in model if isinstance(m, nn.Linear)])
                gathered[0] = 0
                loss = model(torch.randn(8, widths[0], generator=gen)).float().pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(loss.item())
                step_bytes.append(gathered[0])
    finally:
        dist.all_gather_single = all_gather_single
    weights = [v.full_tensor() for v in model.state_dict().values()]
    shapes = [(m.out_features, m.in_features) for m in model if isinstance(m, nn.Linear)]
    return {"losses": losses, "weights": weights, "seen": seen, "expected": expected, "bytes": step_bytes,
            "shapes": shapes, "dtype": param_dtype or torch.float32,
            "warnings": [str(w.message) for w in caught if "snip_ops.fsdp" in str(w.message)]}


def _all_scenarios(rank: int) -> dict:
    return {(name, low): _train(rank, name, low) for name in SCENARIOS for low in (False, True)}


@pytest.fixture(scope="module")
def runs():
    return run_on_ranks(_all_scenarios)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_training_is_bit_identical_to_gathering_in_full_precision(runs, name):
    for rank_runs in runs:
        ref, low = rank_runs[(name, False)], rank_runs[(name, True)]
        assert low["losses"] == ref["losses"]
        assert all(torch.equal(a, b) for a, b in zip(ref["weights"], low["weights"]))
    assert runs[0][(name, True)]["losses"] != runs[1][(name, True)]["losses"]  # the ranks saw different data


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_layers_compute_with_the_layout_their_precision_calls_for(runs, name):
    low = runs[0][(name, True)]
    # forward only (backward reuses the weight FSDP2 re-gathers): one entry per layer and step
    assert low["seen"] == [layout for step in low["expected"] for layout in step]
    assert any(layout != "full" for step in low["expected"] for layout in step)
    assert all(layout == "full" for layout in runs[0][(name, False)]["seen"])


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_all_gather_bytes_are_those_of_the_gathered_layouts(runs, name):
    for low in (False, True):
        r = runs[0][(name, low)]
        for step, layouts in enumerate(r["expected"]):
            layouts = layouts if low else ["full"] * len(layouts)
            per_gather = sum(_bytes_per_gather(lay, n, k, r["dtype"]) for lay, (n, k) in zip(layouts, r["shapes"]))
            assert r["bytes"][step] == 2 * per_gather  # forward, and again for backward


def test_misaligned_layer_falls_back_with_one_warning(runs):
    for name, layer, rows in (("fp8", "4", 97), ("fp4", "4", 96)):
        for rank_runs in runs:
            (message,) = rank_runs[(name, True)]["warnings"]
            assert f"layer {layer!r}" in message and f"{rows} weight rows" in message
    assert all(not rank_runs[("nvfp4", True)]["warnings"] for rank_runs in runs)  # 48-row shards of 16x16 blocks


def test_weights_that_are_already_dtensors_are_refused_clearly():
    """After fully_shard, or under tensor parallelism, the weights are DTensors: a clear error naming the
    layer (in one process: a one-rank group)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = parallelize_module(snip_ops.convert(nn.Sequential(nn.Linear(32, 32)), "fp8"), init_device_mesh("cpu", (1,)),
                                   {"0": ColwiseParallel()})
        with pytest.raises(ValueError, match=r"SnipLinear '0' is already a DTensor.*tensor parallelism"):
            enable_low_precision_all_gather(model)
    finally:
        dist.destroy_process_group()
