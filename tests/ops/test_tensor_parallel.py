"""SnipLinear under tensor parallelism (ColwiseParallel / RowwiseParallel / SequenceParallel), gloo, 2 ranks.

Against the single-process layer with the same weights, seed and SR step: every GEMM whose reduction
dimension is not split is bit-identical (colwise fprop and wgrad, rowwise dgrad and wgrad); the
quantized operands of the split ones are bit-identical, and their results are within
`split_reduction_bound` (snip_ops/tensor_parallel.py derives it).
"""

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gloo import WORLD, run_on_ranks
from snip_ops import LinearPrecision, SnipLinear
from snip_ops.formats import GEMMS
from snip_ops.gemm import emulated_operand
from snip_ops.tensor_parallel import COLWISE, ROWWISE, check_shard_blocks, split_reduction_bound

RECIPES = ("fp8", "fp4", "mxfp4", "nvfp4")
M, K, N = 8, 256, 256  # shards of 128: whole 128x128 weight blocks on each rank
SEED = 7
U = 2.0 ** -24


def _mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (WORLD,))


def _data(precision: str):
    torch.manual_seed(0)
    layer = SnipLinear(K, N, precision=precision, seed=SEED, name="proj")
    gen = torch.Generator().manual_seed(1)
    return layer, torch.randn(M, K, generator=gen), torch.randn(M, N, generator=gen)


def _single(layer: SnipLinear, x: torch.Tensor, dy: torch.Tensor):
    x = x.clone().requires_grad_()
    y = layer(x)
    y.backward(dy)
    return y.detach(), x.grad, layer.weight.grad, layer.bias.grad


def _abs_products(layer: SnipLinear, x: torch.Tensor, dy: torch.Tensor):
    """sum_k |a_k b_k| of the single-process fprop and dgrad, from their quantized operands (SR step 0)."""
    fr, dr = layer.precision.fprop, layer.precision.dgrad
    xq = emulated_operand(x, fr.act, SEED, 0, "x")
    wq = emulated_operand(layer.weight.detach(), fr.weight, SEED, 0, "w")
    dyq = emulated_operand(dy, dr.grad, SEED, 0, "dy")
    wtq = emulated_operand(layer.weight.detach(), dr.weight, SEED, 0, "wt", transpose=True)
    return xq.abs() @ wq.abs().t(), dyq.abs() @ wtq.abs().t()


def _layer_on_ranks(rank: int, style: str, precision: str) -> dict:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    layer, x, dy = _data(precision)
    ref = _single(copy.deepcopy(layer), x, dy)
    fprop_abs, dgrad_abs = _abs_products(layer, x, dy)
    tp = parallelize_module(layer, _mesh(), ColwiseParallel() if style == COLWISE else RowwiseParallel())
    cols = slice(rank * N // WORLD, (rank + 1) * N // WORLD) if style == COLWISE else slice(None)
    ks = slice(rank * K // WORLD, (rank + 1) * K // WORLD) if style == ROWWISE else slice(None)
    x_in = x[:, ks].clone().requires_grad_()
    y = tp(x_in)
    y.backward(dy[:, cols])
    w_grad, b_grad = tp.weight.grad.to_local(), tp.bias.grad.full_tensor()
    out = {"w_grad": torch.equal(w_grad, ref[2][cols, ks]), "b_grad": torch.equal(b_grad, ref[3])}
    if style == COLWISE:  # fprop and wgrad exact; dgrad summed over the ranks' halves of N
        out["y"] = torch.equal(y, ref[0][:, cols])
        out["x_grad_excess"] = float(((x_in.grad - ref[1]).abs() - split_reduction_bound(N, WORLD) * dgrad_abs).max())
    else:  # dgrad and wgrad exact; fprop summed over the ranks' halves of K, then the bias added
        out["x_grad"] = torch.equal(x_in.grad, ref[1][:, ks])
        bound = split_reduction_bound(K, WORLD) * fprop_abs + U * (y.abs() + ref[0].abs())
        out["y_excess"] = float(((y - ref[0]).abs() - bound).max())
    return out


def _operands_on_ranks(rank: int, style: str, precision: str) -> bool:
    """Every operand a sharded tensor gives the layer's GEMMs, quantized on this rank, is the single-process
    quantization of the whole tensor restricted to the shard."""
    from snip_ops.tensor_parallel import _OPERANDS, _SHARDED_DIM, _operand, _Shards

    layer, x, dy = _data(precision)
    tensors = {"x": x, "w": layer.weight.detach(), "dy": dy}
    group = dist.group.WORLD
    identical = True
    for gemm in GEMMS:
        recipe = layer.precision.gemm(gemm)
        for operand, tensor, field, transpose in _OPERANDS[gemm]:
            dim = _SHARDED_DIM[style].get(tensor)
            if dim is None:
                continue
            whole = tensors[tensor]
            size = whole.shape[dim] // WORLD
            spec = getattr(recipe, field)
            shards = _Shards(style, group, (N, K), rank * size)
            mine = _operand(whole.narrow(dim, rank * size, size), tensor, spec, operand, transpose, SEED, 3, shards)
            expected = emulated_operand(whole, spec, SEED, 3, operand, transpose)
            identical &= torch.equal(mine, expected.narrow(1 - dim if transpose else dim, rank * size, size))
    return identical


def _refusals(rank: int) -> list[str]:
    """The errors of precisions whose blocks shards would split: at a plan change and at a forward."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from snip_ops import convert

    errors = []
    up = parallelize_module(SnipLinear(128, 192, name="mlp.up"), _mesh(), ColwiseParallel())  # shards of 96 rows
    up.set_precision("nvfp4")  # 1x16 blocks fit
    for change in (lambda: up.set_precision("fp8"), lambda: convert(nn.Sequential(up), "fp4")):
        try:
            change()
        except ValueError as e:
            errors.append(str(e))
    down = SnipLinear(192, 128, precision="fp8", name="mlp.down")
    down = parallelize_module(down, _mesh(), RowwiseParallel())  # a precision set before the sharding
    try:
        down(torch.randn(4, 96))
    except ValueError as e:
        errors.append(str(e))
    try:  # a plain nn.Linear parallelized first: its hooks would be lost by the conversion
        convert(nn.Sequential(parallelize_module(nn.Linear(128, 256), _mesh(), ColwiseParallel())), "fp8")
    except ValueError as e:
        errors.append(str(e))
    return errors + [str(up.precision)]


def _all_layers(rank: int) -> dict:
    return {"refusals": _refusals(rank),
            **{(style, p): {**_layer_on_ranks(rank, style, p), "operands": _operands_on_ranks(rank, style, p)}
               for style in (COLWISE, ROWWISE) for p in RECIPES}}


def test_sharded_layers_match_the_single_process_layer_and_refuse_split_blocks():
    for results in run_on_ranks(_all_layers):
        *errors, converted_late, kept = results.pop("refusals")
        assert kept == "nvfp4" and len(errors) == 3
        assert "'0' was parallelized (parallelize_module) before its conversion" in converted_late
        for e, name, dim in zip(errors, ("mlp.up", "mlp.up", "mlp.down"), ("out_features", "out_features",
                                                                           "in_features")):
            assert f"SnipLinear {name}" in e and f"{dim}=192 into shards of 96" in e and "128" in e, e
        for (style, precision), r in results.items():
            assert r["operands"] and r["w_grad"] and r["b_grad"], (style, precision, r)
            if style == COLWISE:
                assert r["y"] and r["x_grad_excess"] <= 0, (style, precision, r)
            else:
                assert r["x_grad"] and r["y_excess"] <= 0, (style, precision, r)


B, S, H, F = 2, 8, 128, 256  # batch, sequence (split over the ranks by sequence parallel), model, hidden
STEPS = 4


def _mlp():
    torch.manual_seed(0)
    from snip_ops import convert

    return convert(nn.Sequential(nn.LayerNorm(H), nn.Linear(H, F), nn.ReLU(), nn.Linear(F, H)), "fp8")


def _batches():
    gen = torch.Generator().manual_seed(5)
    return [torch.randn(B, S, H, generator=gen) for _ in range(STEPS)]


def _train(model, batches, precision, loss_of, shard=lambda t: t):
    from snip_ops import convert

    convert(model, precision)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for x in batches:
        loss = loss_of(model(shard(x)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _mlp_on_ranks(rank: int) -> dict:
    return {precision: _mlp_run(rank, precision) for precision in ("fp4", "nvfp4")}


def _mlp_run(rank: int, precision: str) -> dict:
    """The Megatron MLP with a sequence-parallel norm (torchtitan's Llama plan) against one process."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    batches = _batches()
    single = _train(_mlp(), batches, precision, lambda y: y.pow(2).mean())
    mesh = _mesh()
    model = parallelize_module(_mlp(), mesh, {"0": SequenceParallel(), "1": ColwiseParallel(input_layouts=Shard(1)),
                                              "3": RowwiseParallel(output_layouts=Shard(1))})
    seq = slice(rank * S // WORLD, (rank + 1) * S // WORLD)
    sharded = _train(model, batches, precision,
                     lambda y: DTensor.from_local(y, mesh, [Shard(1)]).pow(2).mean().full_tensor(), lambda t: t[:, seq])
    return {"single": single, "sharded": sharded}


def test_megatron_mlp_with_sequence_parallel_trains_like_one_process():
    r0, r1 = run_on_ranks(_mlp_on_ranks)
    for precision in ("fp4", "nvfp4"):
        single, sharded = r0[precision]["single"], r0[precision]["sharded"]
        assert sharded == r1[precision]["sharded"]  # every rank computes the same loss
        # The first loss only differs through the rowwise fprop's split reduction over F: within that
        # reduction's bound, relative to the loss. Later ones also differ through the weights, whose
        # gradients differ in the split dgrad; there one element landing on the other side of a code
        # boundary moves a quantized gradient by a whole code step, which no reduction bound covers.
        # They are held to a tenth of the smallest change of the loss between two steps instead: a
        # shard that computed the wrong thing (a missing reduction, a wrong slice) moves the loss by
        # more than a step does.
        tolerance = split_reduction_bound(F, WORLD)
        assert abs(single[0] - sharded[0]) <= tolerance * abs(single[0]), (precision, single, sharded)
        step_change = min(abs(a - b) for a, b in zip(single, single[1:]))
        for a, b in zip(single[1:], sharded[1:]):
            assert abs(a - b) <= 0.1 * step_change, (precision, single, sharded)


def test_block_checks_name_the_layer_the_shard_and_the_block():
    mxfp4 = LinearPrecision("mxfp4")
    check_shard_blocks("up", COLWISE, LinearPrecision("fp8"), (256, 128), 2)
    check_shard_blocks("up", COLWISE, mxfp4, (192, 128), 2)  # 1x32 blocks: 96 rows or columns are whole blocks
    with pytest.raises(ValueError, match=r"SnipLinear up: colwise .* out_features=192 into shards of 96, .*128x128"):
        check_shard_blocks("up", COLWISE, LinearPrecision("fp8"), (192, 128), 2)
    with pytest.raises(ValueError, match=r"in_features=200 into shards of 100, .*1x16"):
        check_shard_blocks("down", ROWWISE, LinearPrecision("nvfp4"), (128, 200), 2)
    with pytest.raises(ValueError, match=r"out_features=300 into shards of 150"):  # uneven: chunks 150, 150
        check_shard_blocks("up", COLWISE, LinearPrecision("nvfp4"), (300, 64), 2)
    rowwise_scaled = LinearPrecision("bf16", wgrad="fp8")  # only wgrad quantized: x^T's blocks run along M
    check_shard_blocks("down", ROWWISE, rowwise_scaled, (128, 200), 2)
    check_shard_blocks("up", COLWISE, LinearPrecision("fp8"), (192, 128), 1)  # one rank: nothing is split


def _fsdp_tp_on_ranks(rank: int) -> dict:
    """The MLP under FSDP2 + TP (a 2-D mesh, FSDP's dimension of size 1 here: 2 processes) against TP
    alone, with a plan change between steps; then a plan that would split a block."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)
    from snip_ops import convert

    plan = {"0": SequenceParallel(), "1": ColwiseParallel(input_layouts=Shard(1)),
            "3": RowwiseParallel(output_layouts=Shard(1))}
    seq = slice(rank * S // WORLD, (rank + 1) * S // WORLD)
    out = {}
    for name, mesh_shape in (("tp", (WORLD,)), ("fsdp_tp", (1, WORLD))):
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("tp",) if len(mesh_shape) == 1 else ("dp", "tp"))
        tp_mesh = mesh["tp"] if len(mesh_shape) == 2 else mesh
        model = parallelize_module(_mlp(), tp_mesh, plan)
        if len(mesh_shape) == 2:
            fully_shard(model, mesh=mesh["dp"])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for step, x in enumerate(_batches()):
            convert(model, "fp4" if step < 2 else "nvfp4")  # a plan change between steps
            loss = DTensor.from_local(model(x[:, seq]), tp_mesh, [Shard(1)]).pow(2).mean().full_tensor()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        out[name] = losses
        if len(mesh_shape) == 2:
            try:
                model[1].set_precision("fp8")  # 256 / 2 = 128 rows per shard: whole 128x128 blocks
                small = parallelize_module(convert(nn.Sequential(nn.Linear(H, 192)), "bf16"), tp_mesh,
                                           {"0": ColwiseParallel()})
                fully_shard(small, mesh=mesh["dp"])
                small[0].set_precision("fp8")  # 96 rows per shard would split a 128x128 block
                out["refused"] = None
            except ValueError as e:
                out["refused"] = str(e)
    return out


def test_fsdp2_with_tensor_parallel_trains_like_tensor_parallel_alone():
    for r in run_on_ranks(_fsdp_tp_on_ranks):
        assert r["fsdp_tp"] == r["tp"]  # FSDP2 over a dimension of one rank changes no number
        assert r["refused"] is not None and "shards of 96" in r["refused"] and "128x128" in r["refused"]
