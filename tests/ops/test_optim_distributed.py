"""snip_ops.optim.AdamW across processes (gloo, 2 CPU ranks): the shared seed makes every rank round
identically under DDP; DTensor shards (FSDP2) draw the bits of their global indices, so a sharded
step equals the unsharded one bit for bit."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gloo import WORLD, run_on_ranks, wrap


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 7)).to(torch.bfloat16)


def _train(wrapped, opt, rank, steps=5):
    gen = torch.Generator().manual_seed(100 + rank)  # different data per rank
    for _ in range(steps):
        x = torch.randn(16, 24, generator=gen).to(torch.bfloat16)
        loss = wrapped(x).float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _flat_state(module):
    state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in module.state_dict().items()}
    return torch.cat([v.detach().float().flatten() for v in state.values()])


def _gathered_identical(flat):
    gathered = [torch.zeros_like(flat) for _ in range(WORLD)]
    dist.all_gather(gathered, flat)
    return all(torch.equal(gathered[0], g) for g in gathered)


def _worker(rank, case):
    from snip_ops import convert
    from snip_ops.optim import AdamW

    if case == "dtensor":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (WORLD,))
        gen = torch.Generator().manual_seed(0)
        shapes = [(5, 5), (7, 3), (9,), (1, 6)]  # shard offsets 15, 12, 5 and an empty shard
        fulls = [torch.randn(s, generator=gen).to(torch.bfloat16) for s in shapes]
        grads = [[torch.randn(s, generator=gen).to(torch.bfloat16) for s in shapes] for _ in range(3)]
        sharded = [nn.Parameter(distribute_tensor(f.clone(), mesh, [Shard(0)])) for f in fulls]
        plain = [nn.Parameter(f.clone()) for f in fulls]
        opts = [AdamW(sharded, lr=1e-2, seed=9, state_dtype=torch.bfloat16),
                AdamW(plain, lr=1e-2, seed=9, state_dtype=torch.bfloat16)]
        for step_grads in grads:
            for p, q, g in zip(sharded, plain, step_grads):
                p.grad = distribute_tensor(g.clone(), mesh, [Shard(0)])
                q.grad = g.clone()
            for opt in opts:
                opt.step()
        return {"equal": all(torch.equal(p.full_tensor(), q.detach()) for p, q in zip(sharded, plain))}

    model = convert(_model(), "fp8")
    wrapped = wrap(model, case)
    opt = AdamW(wrapped.parameters(), lr=1e-2, seed=1234)
    before = _flat_state(wrapped)
    _train(wrapped, opt, rank)
    after = _flat_state(wrapped)
    return {
        "identical": _gathered_identical(after),
        "moved": not torch.equal(before, after),
        "finite": bool(torch.isfinite(after).all()),
        "bf16": all(p.dtype == torch.bfloat16 for p in wrapped.parameters()),
        "flat": after,
    }


@pytest.mark.parametrize("case", ["ddp", "fsdp2"])
def test_ranks_round_identically(case):
    first = run_on_ranks(_worker, case)
    for r in first:
        assert r["identical"] and r["moved"] and r["finite"] and r["bf16"]
    if case == "ddp":  # and a second pair of processes reproduces the run bit for bit
        second = run_on_ranks(_worker, case)
        assert torch.equal(first[0]["flat"], second[0]["flat"])


def test_dtensor_shards_equal_the_unsharded_step():
    for r in run_on_ranks(_worker, "dtensor"):
        assert r["equal"]
