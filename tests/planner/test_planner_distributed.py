"""Two gloo processes measure on different batches and end up with the same plan and statistics."""

import json

import pytest
import torch

from causal_lm import CausalLM
from planner import DivergenceConfig, PlannerConfig, SnipPlanner, StatsConfig
from planner.divergence import lm_logits, measure

from gloo import run_on_ranks


def _measure_and_plan(rank: int) -> dict:
    torch.manual_seed(0)  # the same initial model on every rank
    model = CausalLM.build(dim=128, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=16)
    opt = torch.optim.AdamW(model.parameters())
    cfg = PlannerConfig(stats=StatsConfig(max_rows=32), divergence=DivergenceConfig(draws=1))
    planner = SnipPlanner(model, opt, cfg)
    batch = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(100 + rank))  # per-rank data
    local = measure(planner.model, planner.layers, opt, batch, planner.loss_fn, cfg.candidates, cfg.stats,
                    cfg.divergence, logits_fn=lm_logits)  # the planner's default for a causal LM
    plan = planner.step(0, batch)
    return json.loads(json.dumps({"plan": plan.to_json(), "local": local.to_json()}))


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
def test_two_gloo_ranks_get_identical_plans():
    r0, r1 = run_on_ranks(_measure_and_plan)
    assert r0["plan"] == r1["plan"]
    assert r0["local"] != r1["local"]  # different batches measured differently ...
    reduced = r0["plan"]["stats"]["layers"]
    for k, layer in enumerate(reduced):  # ... and the plan was made from their mean, exactly: a float64
        for key in ("curvature", "s_dgrad", "s_wgrad"):  # all-reduce of two values is a + b, then / 2
            assert layer[key] == (r0["local"]["layers"][k][key] + r1["local"]["layers"][k][key]) / 2
