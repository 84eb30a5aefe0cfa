"""Checkpoints of converted models: torch.save and torch.distributed.checkpoint round trips; the plan
is a separate artifact (precision is not part of the state dict)."""

import torch
import torch.distributed.checkpoint as dcp
from torch import nn

from snip_ops import convert


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def test_torch_save_round_trip(tmp_path):
    model = convert(_model(0), {"0": "fp8", "2": "fp4"})
    torch.save(model.state_dict(), tmp_path / "model.pt")
    restored = convert(_model(1), "bf16")
    restored.load_state_dict(torch.load(tmp_path / "model.pt"))
    plain = _model(2)
    plain.load_state_dict(torch.load(tmp_path / "model.pt"))
    x = torch.randn(4, 16)
    assert torch.equal(restored(x), plain(x))
    convert(restored, {"0": "fp8", "2": "fp4"})
    assert torch.equal(restored(x), model(x))


def test_distributed_checkpoint_round_trip(tmp_path):
    model = convert(_model(0), "mxfp8")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 16)).sum().backward()
    opt.step()
    dcp.save({"model": model.state_dict()}, checkpoint_id=str(tmp_path / "ckpt"))
    restored = convert(_model(1), "mxfp8")
    state = {"model": restored.state_dict()}
    dcp.load(state, checkpoint_id=str(tmp_path / "ckpt"))
    restored.load_state_dict(state["model"])
    for a, b in zip(model.state_dict().values(), restored.state_dict().values()):
        assert torch.equal(a, b)
