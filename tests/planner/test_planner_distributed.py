"""Two gloo processes measure on different batches and end up with the same plan and statistics (and, with
the schedule's drift trigger, the same regret and next re-plan step)."""

import json

import pytest
import torch

from causal_lm import CausalLM
from planner import DivergenceConfig, PlannerConfig, PrecisionSchedule, SnipPlanner, StatsConfig
from planner.divergence import PlannedModel, lm_logits, measure

from gloo import run_on_ranks


def _measure_and_plan(rank: int) -> dict:
    torch.manual_seed(0)  # the same initial model on every rank
    model = CausalLM.build(dim=128, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=16)
    opt = torch.optim.AdamW(model.parameters())
    cfg = PlannerConfig(stats=StatsConfig(max_rows=32), divergence=DivergenceConfig(draws=1), interval=4,
                        schedule=PrecisionSchedule(drift=1e-9, min_interval=1))
    planner = SnipPlanner(model, opt, cfg)
    batch = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(100 + rank))  # per-rank data
    planned = PlannedModel(planner.model, planner.layers, opt, planner.loss_fn, lm_logits)  # a causal LM's default
    local = measure(planned, batch, cfg.candidates, cfg.stats, cfg.divergence_config)
    plan = planner.step(0, batch)
    again = planner.step(1, torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(200 + rank)))
    return json.loads(json.dumps({"plan": plan.to_json(), "local": local.to_json(), "again": again is not None,
                                  "history": [{k: h[k] for k in ("step", "regret", "next_step") if k in h}
                                              for h in planner.history],
                                  "schedule": planner.schedule_state.to_json()}))


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_two_gloo_ranks_get_identical_plans():
    r0, r1 = run_on_ranks(_measure_and_plan)
    assert r0["plan"] == r1["plan"]
    assert r0["again"] and r0["history"] == r1["history"] and r0["schedule"] == r1["schedule"]
    assert r0["history"][1]["step"] == 1 and r0["history"][1]["regret"] >= 0
    assert r0["local"] != r1["local"]  # different batches measured differently ...
    reduced = r0["plan"]["stats"]["layers"]
    for k, layer in enumerate(reduced):  # ... and the plan was made from their mean, exactly: a float64
        for key in ("curvature", "s_dgrad", "s_wgrad"):  # all-reduce of two values is a + b, then / 2
            assert layer[key] == (r0["local"]["layers"][k][key] + r1["local"]["layers"][k][key]) / 2


def _measure_under_fsdp2(rank: int) -> dict:
    """The planner on a fully_shard-ed model: it measures the whole parameters (planner/fsdp.py) and
    finds what it finds on the same model unsharded."""
    from torch.distributed.fsdp import fully_shard

    def build():
        torch.manual_seed(0)
        return CausalLM.build(dim=128, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=16)

    cfg = PlannerConfig(stats=StatsConfig(max_rows=32), divergence=DivergenceConfig(draws=1))
    batch = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(100 + rank))
    out = {}
    for name in ("plain", "fsdp2"):
        model = build()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        planner = SnipPlanner(model, opt, cfg)  # converts the linear layers before fully_shard
        if name == "fsdp2":
            for layer in model.model.layers:
                fully_shard(layer)
            fully_shard(model)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # over the sharded parameters
            planner.optimizer = opt
        # One step on a batch all ranks share (FSDP2 averages their gradients, and the unsharded runs
        # must end up with the same weights), so that the planner reads Adam state.
        model.loss(torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(7))).backward()
        opt.step()
        opt.zero_grad()
        plan = planner.step(0, batch)
        out[name] = json.loads(json.dumps(plan.to_json()))
        out[name + "_sharded_after"] = any(isinstance(p, torch.distributed.tensor.DTensor) for p in model.parameters())
    return out


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_planner_measures_a_fully_sharded_model_like_the_unsharded_one():
    r0, r1 = run_on_ranks(_measure_under_fsdp2)
    assert r0["fsdp2"]["plan"] == r1["fsdp2"]["plan"] == r0["plain"]["plan"]
    assert r0["fsdp2_sharded_after"]  # resharded after the measurement
    for a, b in zip(r0["fsdp2"]["stats"]["layers"], r0["plain"]["stats"]["layers"]):
        for key in ("curvature", "s_dgrad", "s_wgrad", "out_rms"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), key
