"""Two gloo processes measure on different batches and end up with the same plan and statistics."""

import json
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from planner import DivergenceConfig, PlannerConfig, SnipPlanner, StatsConfig
from planner.divergence import measure
from snip_train.model import Llama, LlamaConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)  # the same initial model on every rank
        model = Llama(LlamaConfig(dim=128, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=16))
        opt = torch.optim.AdamW(model.parameters())
        cfg = PlannerConfig(stats=StatsConfig(max_rows=32), divergence=DivergenceConfig(draws=1))
        planner = SnipPlanner(model, opt, cfg)
        batch = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(100 + rank))  # per-rank data
        local = measure(planner.model, planner.layers, opt, batch, planner.loss_fn, cfg.candidates, cfg.stats,
                        cfg.divergence)
        plan = planner.step(0, batch)
        with open(f"{out_dir}/rank{rank}.json", "w") as f:
            json.dump({"plan": plan.to_json(), "local": local.to_json()}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_two_gloo_ranks_get_identical_plans(tmp_path):
    # spawn, not fork: a forked child cannot run autograd once the parent has (as earlier tests do).
    mp.start_processes(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["plan"] == r1["plan"]
    assert r0["local"] != r1["local"]  # different batches measured differently ...
    reduced = r0["plan"]["stats"]["layers"]
    for k, layer in enumerate(reduced):  # ... and the plan was made from their mean
        for key in ("curvature", "s_dgrad", "s_wgrad"):
            mean = (r0["local"]["layers"][k][key] + r1["local"]["layers"][k][key]) / 2
            assert layer[key] == pytest.approx(mean, rel=1e-9, abs=1e-300)
