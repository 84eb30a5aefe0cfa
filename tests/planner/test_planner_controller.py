"""SnipPlanner in a training loop, plan JSON round trips, resume, baselines, generic models."""

import json

import pytest
import torch
from torch import nn

from causal_lm import CausalLM
from planner import BASELINES, Budget, DivergenceConfig, Plan, PlannerConfig, SnipPlanner, StatsConfig, baseline
from planner.baselines import block_index
from planner.cost import plan_metrics
from snip_ops import SnipLinear

CONFIG = dict(dim=128, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=16)
FAST = dict(stats=StatsConfig(max_rows=64), divergence=DivergenceConfig(draws=1))


pytestmark = pytest.mark.usefixtures("one_thread")


def setup(seed=0, **overrides):
    torch.manual_seed(seed)
    model = CausalLM.build(**CONFIG)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    planner = SnipPlanner(model, opt, PlannerConfig(interval=2, **FAST), **overrides)
    return model, opt, planner


def batches(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 64, (2, 17), generator=gen) for _ in range(n)]


def precisions(model):
    return {n: str(m.precision) for n, m in model.named_modules() if isinstance(m, SnipLinear)}


@pytest.fixture(scope="module")
def trained():
    """Three training steps with re-plans at steps 0 and 2; the planner's state after step 0."""
    model, opt, planner = setup()
    plans, snapshot = [], None
    for step, b in enumerate(batches(3)):
        plans.append(planner.step(step, b))
        if step == 0:
            snapshot = json.loads(json.dumps(planner.state_dict()))
        model.loss(b).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model, planner, plans, snapshot


def test_replans_on_schedule_and_installs_the_plan(trained):
    model, planner, plans, _ = trained
    assert [p is not None for p in plans] == [True, False, True]
    assert "no Adam state" in plans[0].stats.preconditioner and "no Adam state" not in plans[2].stats.preconditioner
    assert len(planner.layers) == 14 and "lm_head" not in planner.layers
    assert precisions(model) == {n: str(p) for n, p in planner.plan.precisions.items()}
    for plan in (plans[0], plans[2]):
        assert plan.metrics["fp4_fraction"] >= 0.75 and plan.step in (0, 2)
    assert [h["step"] for h in planner.history] == [0, 2]


def test_plan_json_round_trip(tmp_path, trained):
    plan = trained[1].plan
    plan.save(tmp_path / "plan.json")
    again = Plan.load(tmp_path / "plan.json")
    assert again.precisions == plan.precisions
    assert again.stats.layers == plan.stats.layers
    assert again.metrics == plan.metrics  # JSON round-trips floats exactly
    assert (again.budget, again.candidates, again.lam, again.step) == (plan.budget, plan.candidates, plan.lam, plan.step)
    obj = json.loads((tmp_path / "plan.json").read_text())
    assert obj["format"] == "snip-plan/1" and set(obj["plan"]) == set(plan.precisions)
    with pytest.raises(ValueError, match="not a snip-plan/1 plan"):
        Plan.from_json({"plan": {}})


def test_resumed_run_continues_with_the_same_plan(trained):
    model, planner, plans, snapshot = trained
    resumed_model, _, resumed = setup()
    resumed.load_state_dict(snapshot)  # as if restarted from a checkpoint taken after step 0
    assert precisions(resumed_model) == {n: str(p) for n, p in plans[0].precisions.items()}
    assert resumed.step(1, batches(1)[0]) is None  # not a re-plan step: the plan stays
    assert resumed.plan.precisions == plans[0].precisions


def test_generic_model_with_custom_loss():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 128), nn.GELU(), nn.Linear(128, 128))
    opt = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(64, 128), torch.randn(64, 128)

    def loss_fn(m, batch):
        return nn.functional.mse_loss(m(batch[0]), batch[1])

    planner = SnipPlanner(model, opt, PlannerConfig(budget=Budget.fp4_fraction(0.5), **FAST), loss_fn=loss_fn)
    plan = planner.step(0, (x, y))
    assert set(plan.precisions) == {"0", "2", "4"}
    assert plan.metrics["fp4_fraction"] >= 0.5
    assert all(isinstance(model[i], SnipLinear) for i in (0, 2, 4))


def test_baselines_share_the_budget(trained):
    stats = trained[1].plan.stats
    shapes = {s.name: s.shape for s in stats.layers}
    budget = Budget.fp4_fraction(0.6)
    plans = {name: baseline(name, stats, budget) for name in BASELINES}
    for name, plan in plans.items():
        met = budget.satisfied_by(plan_metrics(plan.assignment(), shapes))
        assert met == (name != "uniform_fp8") and plan.metrics["meets_budget"] == float(met), name
    fp8_layers = {name: {n for n, p in plan.precisions.items() if p.fprop.name == "fp8"} for name, plan in plans.items()}
    assert not fp8_layers["uniform_fp4"]
    assert all(n.endswith(("down_proj", "o_proj")) for n in fp8_layers["layer_type"])
    assert fp8_layers["first_last"]  # two blocks: both are end blocks, kept by module order
    assert baseline("random", stats, budget, seed=1).precisions == baseline("random", stats, budget, seed=1).precisions
    errors = {s.name: s.errors["fp4"]["fprop"] for s in stats.layers}
    assert max(errors[n] for n in plans["min_error"].precisions if n not in fp8_layers["min_error"]) <= \
        min(errors[n] for n in fp8_layers["min_error"])
    with pytest.raises(ValueError, match="unknown baseline"):
        baseline("best", stats, budget)
    assert block_index("model.layers.12.mlp.up_proj") == 12 and block_index("lm_head") is None


def test_config_errors():
    with pytest.raises(ValueError, match="unknown precision"):
        PlannerConfig(candidates=("fp8", "int4"))
    with pytest.raises(ValueError, match="interval"):
        PlannerConfig(interval=0)
    with pytest.raises(ValueError, match="per layer"):
        PlannerConfig(method="random", granularity="gemm")
    with pytest.raises(ValueError, match="method must be"):
        PlannerConfig(method="greedy")
    model, opt, _ = setup()
    with pytest.raises(TypeError, match="no .loss"):
        SnipPlanner(nn.Sequential(nn.Linear(4, 4)), None, PlannerConfig(**FAST)).step(0, torch.randn(2, 4))
