"""Converted models under DDP and FSDP2 (fully_shard) with gloo, 2 CPU processes."""

import pytest
import torch
import torch.distributed as dist
from torch import nn

from gloo import WORLD, run_on_ranks, wrap


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 16))


def _train(rank, wrapper):
    from snip_ops import convert

    model = convert(_model(), "fp4")
    wrapped = wrap(model, wrapper)
    opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(100 + rank)  # different data per rank
    losses = []
    for step in range(6):
        if step == 3:  # a new plan between steps, without re-wrapping
            convert(model, {"0": "fp8", "2": "mxfp4", "4": "bf16"})
        x = torch.randn(16, 32, generator=gen)
        loss = wrapped(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in wrapped.state_dict().items()}
    flat = torch.cat([v.detach().flatten() for v in state.values()])
    gathered = [torch.zeros_like(flat) for _ in range(WORLD)]
    dist.all_gather(gathered, flat)
    return {
        "identical": all(torch.equal(gathered[0], g) for g in gathered),
        "finite": bool(torch.isfinite(flat).all()),
        "losses": losses,
        "plan": [str(m.precision) for m in model if hasattr(m, "precision")],
    }


@pytest.mark.parametrize("wrapper", ["ddp", "fsdp2"])
def test_two_rank_training_keeps_ranks_identical(wrapper):
    for r in run_on_ranks(_train, wrapper):
        assert r["identical"] and r["finite"]
        assert r["plan"] == ["fp8", "mxfp4", "bf16"]
        assert all(torch.isfinite(torch.tensor(r["losses"])))
