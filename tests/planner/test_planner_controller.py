"""SnipPlanner in a training loop, plan JSON round trips, resume, baselines, generic models."""

import itertools
import json
import math

import pytest
import torch
from torch import nn

from causal_lm import CausalLM
from planner import BASELINES, Budget, DivergenceConfig, Plan, PlannerConfig, SnipPlanner, StatsConfig, baseline
from planner.baselines import baseline_objective, block_index
from planner.divergence import lm_logits
from planner.cost import gemm_flops, plan_metrics
from planner.stats import batch_rows, first_rows
from snip_ops.formats import GEMMS
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


def test_the_random_baseline_plans_with_its_seed():
    _, _, planner = setup(method="random", baseline_seed=3, granularity="gemm")
    stats = planner.measure(batches(1)[0])
    want = baseline("random", stats, planner.config.budget, seed=3, granularity="gemm")
    assert planner.solve(stats).precisions == want.precisions
    assert want.precisions != baseline("random", stats, planner.config.budget, granularity="gemm").precisions


def test_baselines_share_the_budget(trained):
    stats = trained[1].plan.stats
    shapes = {s.name: s.shape for s in stats.layers}
    budget = Budget.fp4_fraction(0.6)
    plans = {name: baseline(name, stats, budget) for name in BASELINES}
    for name, plan in plans.items():
        met = budget.satisfied_by(plan_metrics(plan.assignment(), shapes))
        assert met == (name != "uniform_fp8") and plan.method == name, name
        assert "meets_budget" not in plan.metrics or plan.metrics["meets_budget"] == float(met)
    fp8_layers = {name: {n for n, p in plan.precisions.items() if p.fprop.name == "fp8"} for name, plan in plans.items()}
    assert not fp8_layers["uniform_fp4"]
    # 60% FP4 is reached with every down_proj and o_proj in FP8: the heuristic keeps them all there
    assert {n for n in plans["layer_type"].precisions if n.endswith(("down_proj", "o_proj"))} <= fp8_layers["layer_type"]
    assert fp8_layers["first_last"]  # two blocks: both are end blocks
    assert baseline("random", stats, budget, seed=1).precisions == baseline("random", stats, budget, seed=1).precisions
    with pytest.raises(ValueError, match="unknown baseline"):
        baseline("best", stats, budget)
    assert block_index("model.layers.12.mlp.up_proj") == 12 and block_index("lm_head") is None


@pytest.mark.parametrize("name", [b for b in BASELINES if not b.startswith("uniform_")])
def test_each_baseline_is_the_best_plan_of_its_own_scores(trained, name):
    """Every plan of the 14 layers (2^14), by brute force: none that meets the budget has a lower score."""
    stats = trained[1].plan.stats
    budget = Budget.fp4_fraction(0.6)
    plan = baseline(name, stats, budget)
    score = baseline_objective(name, stats, "fp4")
    layers = stats.layers
    flops = [sum(gemm_flops(s.shape, g) for g in GEMMS) for s in layers]
    value = {(s.name, p): sum(score(s, g, p) for g in GEMMS) for s in layers for p in ("fp8", "fp4")}
    best = math.inf
    for bits in itertools.product((0, 1), repeat=len(layers)):
        low = sum(f for f, b in zip(flops, bits) if b)
        if low < 0.6 * sum(flops) * (1 - 1e-12):
            continue
        best = min(best, sum(value[s.name, "fp4" if b else "fp8"] for s, b in zip(layers, bits)))
    got = sum(value[n, p.fprop.name] for n, p in plan.precisions.items())
    assert got <= best * (1 + 1e-9) + 1e-300, (got, best)


@pytest.mark.parametrize("name", [b for b in BASELINES if not b.startswith("uniform_")])
def test_baselines_per_gemm(trained, name):
    """Per GEMM, a baseline meets the same budget and scores no worse by its own scores than its per-layer plan
    (every per-layer plan is a per-GEMM plan); the heuristics without errors keep their layers' order and send
    a layer's backward GEMMs low before its forward GEMM."""
    stats = trained[1].plan.stats
    shapes = {s.name: s.shape for s in stats.layers}
    budget = Budget.fp4_fraction(0.6)
    per_gemm = baseline(name, stats, budget, granularity="gemm")
    per_layer = baseline(name, stats, budget)
    assert per_gemm.granularity == "gemm" and budget.satisfied_by(plan_metrics(per_gemm.assignment(), shapes))
    score = baseline_objective(name, stats, "fp4", granularity="gemm")
    by_name = stats.by_name()

    def total(plan):
        return sum(score(by_name[n], g, p) for (n, g), p in plan.assignment().items())

    assert total(per_gemm) <= total(per_layer) * (1 + 1e-9) + 1e-300
    if name in ("first_last", "layer_type", "random"):
        for n, p in per_gemm.precisions.items():
            assert p.fprop.name == "fp8" or (p.dgrad.name, p.wgrad.name) == ("fp4", "fp4"), (n, p)
        if name == "layer_type":  # 60% FP4 < the backward GEMMs' 2/3: every down_proj / o_proj forward stays FP8
            assert all(p.fprop.name == "fp8" for n, p in per_gemm.precisions.items() if n.endswith(("down_proj", "o_proj")))


def test_config_errors():
    with pytest.raises(ValueError, match="unknown precision"):
        PlannerConfig(candidates=("fp8", "int4"))
    with pytest.raises(ValueError, match="interval"):
        PlannerConfig(interval=0)
    assert PlannerConfig(method="random", granularity="gemm").granularity == "gemm"  # baselines per GEMM too
    with pytest.raises(ValueError, match="method must be"):
        PlannerConfig(method="greedy")
    for bad in (0, "forever", 2.5, "run_start", "run_end"):  # "run_end" (WD priced at the run's end) was removed
        with pytest.raises(ValueError, match="wd_horizon must be 'interval', 'settled' or a number of steps"):
            PlannerConfig(wd_horizon=bad)
    with pytest.raises(ValueError, match="PlannerConfig.wd_horizon"):
        PlannerConfig(divergence=DivergenceConfig(wd_horizon=5))
    model, opt, _ = setup()
    with pytest.raises(TypeError, match="no .loss"):
        SnipPlanner(nn.Sequential(nn.Linear(4, 4)), None, PlannerConfig(**FAST)).step(0, torch.randn(2, 4))


def test_default_plans_are_per_gemm_with_wd_over_the_re_plan_interval():
    """A plan lives `interval` steps: by default WD prices the excess loss within them, per GEMM."""
    d = PlannerConfig(interval=40, divergence=DivergenceConfig(draws=3))
    assert d.granularity == "gemm" and d.divergence_config == DivergenceConfig(draws=3, wd_horizon=40)
    assert PlannerConfig(wd_horizon=7).divergence_config.wd_horizon == 7
    assert PlannerConfig(wd_horizon="settled").divergence_config.wd_horizon is None


def test_wd_horizon_reads_the_learning_rate_schedule_from_the_re_plan_step():
    """lr_schedule gives the horizon's learning rates relative to the re-plan step's; without it (or with a
    settled WD, or a zero rate at the step) the horizon keeps the current rate; a negative rate is refused."""
    _, _, planner = setup(lr_schedule=lambda step: max(10.0 - step, 0.0))  # interval 2: the horizon is 2 steps
    assert planner._lr_ratios(2) == [1.0, 7 / 8] and planner._lr_ratios(None) is None
    assert planner._lr_ratios(10) is None  # no learning rate left: the optimizer's (0) prices WD
    assert planner._lr_ratios(9) == [1.0, 0.0]
    with pytest.raises(ValueError, match="must be finite and >= 0"):
        setup(lr_schedule=lambda step: 1.0 - step)[2]._lr_ratios(1)
    assert setup()[2]._lr_ratios(2) is None
    _, _, settled = setup(lr_schedule=lambda step: 1.0, wd_horizon="settled")
    assert settled._lr_ratios(2) is None
    batch = batches(1)[0]
    full = setup(lr_schedule=lambda step: 1.0)[2].measure(batch, step=0)
    ending = setup(lr_schedule=lambda step: 1.0 if step < 1 else 0.0)[2].measure(batch, step=0)  # one step left
    for f, e in zip(full.layers, ending.layers):
        assert 0 < e.s_wgrad < f.s_wgrad and e.curvature == f.curvature


def test_batches_are_halved_and_cut_tensor_by_tensor():
    x, y = torch.randn(6, 3), torch.arange(6)
    batch = {"inputs": (x, [y, "tag"]), "scale": 2.0, "mask": torch.ones(6, 2)}
    assert batch_rows(batch) == 6 and batch_rows(x) == 6
    cut = first_rows(batch, 2)
    assert torch.equal(cut["inputs"][0], x[:2]) and torch.equal(cut["inputs"][1][0], y[:2])
    assert cut["inputs"][1][1] == "tag" and cut["scale"] == 2.0 and cut["mask"].shape == (2, 2)
    assert isinstance(cut["inputs"], tuple) and isinstance(cut["inputs"][1], list)
    for bad in ((x, torch.arange(5)), {"a": "text"}, torch.tensor(1.0)):  # disagreeing, no tensor, no dimension
        assert batch_rows(bad) is None


def test_default_curvature_is_fisher_for_a_causal_lm_window_batch():
    """The default loss on a [B, T+1] token batch: the Fisher curvature (never negative); a custom loss: the
    batched Hessian estimate; a model whose forward gives no logits of the batch's shape: a clear error."""
    model, _, planner = setup()
    stats = planner.measure(batches(1)[0])
    assert stats.diagnostics["ld_fisher"] == 1.0 and all(s.curvature >= 0 for s in stats.layers)
    custom = planner.measure(batches(1)[0], loss_fn=lambda m, b: m.loss(b))
    assert custom.diagnostics["ld_fisher"] == 0.0
    with pytest.raises(TypeError, match="logits_fn"):
        lm_logits(lambda tokens: tokens.float().sum(-1), batches(1)[0])
