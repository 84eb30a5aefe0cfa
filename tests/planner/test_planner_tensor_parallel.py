"""The planner under tensor parallelism (TP=2) and data parallelism (DP=2), gloo, 2 ranks.

Under TP the statistics are measured on the unsharded replica (planner/controller.py): on the same weights,
optimizer state and batch they are exactly the single-process statistics, and every rank installs the same
plan. Under DP they are the mean of the replicas' statistics.
"""

import json

import torch
import torch.distributed as dist
from torch import nn

from gloo import WORLD, run_on_ranks
from planner import DivergenceConfig, PlannerConfig, SnipPlanner, StatsConfig

D, F, T = 128, 256, 32  # model and hidden width, tokens per batch


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, F), nn.ReLU(), nn.Linear(F, D))


def _loss(model, batch):
    return model(batch).pow(2).mean()


def _config():
    return PlannerConfig(stats=StatsConfig(max_rows=16), divergence=DivergenceConfig(draws=1, method="batched"))


def _adam_step(model, opt, grads):
    """One AdamW step from given whole gradients (sharded like the parameters): the same weights and Adam
    state with or without tensor parallelism."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for p, g in zip(model.parameters(), grads):
        p.grad = distribute_tensor(g, p.device_mesh, p.placements) if isinstance(p, DTensor) else g.clone()
    opt.step()
    opt.zero_grad()


def _plan(planner, batch) -> dict:
    plan = planner.step(0, batch)
    return json.loads(json.dumps(plan.to_json()))


def _tp_on_ranks(rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from snip_ops import convert

    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(p.shape, generator=gen) for p in _mlp().parameters()]
    batch = torch.randn(T, D, generator=gen)  # one batch: the two ranks are one TP group
    single = _mlp()
    opt = torch.optim.AdamW(single.parameters(), lr=1e-2)
    _adam_step(single, opt, grads)
    reference = _plan(SnipPlanner(single, opt, _config(), loss_fn=_loss), batch)

    mesh = init_device_mesh("cpu", (WORLD,))
    model = parallelize_module(convert(_mlp()), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _adam_step(model, opt, grads)
    planner = SnipPlanner(model, opt, _config(), loss_fn=_loss, tp_group=mesh.get_group())
    plan = _plan(planner, batch)
    model(batch).sum().backward()  # the installed plan runs on the shards
    return {"plan": plan, "reference": reference}


def test_tensor_parallel_statistics_are_the_single_process_ones():
    r0, r1 = run_on_ranks(_tp_on_ranks)
    assert r0["plan"] == r1["plan"]
    # The same weights, Adam state and batch, measured whole: the statistics agree exactly.
    assert r0["plan"]["stats"]["layers"] == r0["reference"]["stats"]["layers"]
    assert r0["plan"]["plan"] == r0["reference"]["plan"]


def _dp_on_ranks(rank: int) -> dict:
    tp_groups = [dist.new_group([r]) for r in range(WORLD)]  # every rank its own TP group of one
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters())
    batch = torch.randn(T, D, generator=torch.Generator().manual_seed(10 + rank))  # per-replica data
    local = SnipPlanner(_mlp(), None, _config(), loss_fn=_loss).measure(batch)
    planner = SnipPlanner(model, opt, _config(), loss_fn=_loss, tp_group=tp_groups[rank], dp_group=dist.group.WORLD)
    return json.loads(json.dumps({"plan": _plan(planner, batch), "local": local.to_json()}))


def test_data_parallel_replicas_average_their_statistics():
    r0, r1 = run_on_ranks(_dp_on_ranks)
    assert r0["plan"] == r1["plan"]
    for k, layer in enumerate(r0["plan"]["stats"]["layers"]):  # a float64 all-reduce of two values: (a + b) / 2
        for key in ("out_rms", "curvature", "s_wgrad"):
            assert layer[key] == (r0["local"]["layers"][k][key] + r1["local"]["layers"][k][key]) / 2


def _fsdp_tp_on_ranks(rank: int) -> dict:
    """FSDP2 over TP (a 2-D mesh, its FSDP dimension of one rank with 2 processes): the planner unshards
    the FSDP modules, then gathers the TP shards, and finds the single-process statistics."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from snip_ops import convert

    gen = torch.Generator().manual_seed(3)
    grads = [torch.randn(p.shape, generator=gen) for p in _mlp().parameters()]
    batch = torch.randn(T, D, generator=gen)
    single = _mlp()
    opt = torch.optim.AdamW(single.parameters(), lr=1e-2)
    _adam_step(single, opt, grads)
    reference = _plan(SnipPlanner(single, opt, _config(), loss_fn=_loss), batch)

    mesh = init_device_mesh("cpu", (1, WORLD), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(convert(_mlp()), mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _adam_step(model, opt, grads)
    planner = SnipPlanner(model, opt, _config(), loss_fn=_loss, tp_group=mesh["tp"].get_group(),
                          dp_group=mesh["dp"].get_group())
    plan = _plan(planner, batch)
    model(batch).sum().backward()  # the installed plan runs on the shards
    return {"plan": plan, "reference": reference}


def test_fsdp2_with_tensor_parallel_statistics_are_the_single_process_ones():
    r0, r1 = run_on_ranks(_fsdp_tp_on_ranks)
    assert r0["plan"] == r1["plan"]
    assert r0["plan"]["stats"]["layers"] == r0["reference"]["stats"]["layers"]
