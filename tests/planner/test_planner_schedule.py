"""The precision schedule: re-plans on a loss spike and at the start of learning-rate decay, a raised budget
after decay or when quantization noise outgrows the gradient's own, re-plans spaced by how stale the last
plan went (drift), its state in the planner's checkpoint."""

import dataclasses
import math

import pytest
import torch

from causal_lm import CausalLM
from planner import Budget, DivergenceConfig, PlannerConfig, PrecisionSchedule, SnipPlanner, StatsConfig
from planner.baselines import baseline_objective
from planner.ilp import gemm_objective
from planner.schedule import ScheduleState
from snip_ops.formats import GEMMS

FAST = dict(stats=StatsConfig(max_rows=32), divergence=DivergenceConfig(draws=1))
BASE, RAISED = Budget.fp4_fraction(0.9), Budget.fp4_fraction(0.5)

pytestmark = pytest.mark.usefixtures("one_thread")


def setup(schedule, interval=100):
    torch.manual_seed(0)
    model = CausalLM.build(dim=128, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=128, max_seq_len=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return SnipPlanner(model, opt, PlannerConfig(budget=BASE, interval=interval, schedule=schedule, **FAST)), opt


def batch(seed=0):
    return torch.randint(0, 64, (4, 9), generator=torch.Generator().manual_seed(seed))


def test_state_triggers():
    sched = PrecisionSchedule(loss_spike=0.5, lr_decay=0.1, raised_budget=RAISED, loss_ema=0.5)
    state = ScheduleState()
    assert [state.observe_loss(sched, x) for x in (2.0, 2.0, 3.1, 2.0, float("nan"))] == [False, False, True, False,
                                                                                          False]
    assert state.spike_pending and state.loss_average == pytest.approx(0.5 * (0.5 * 2.0 + 0.5 * 3.1) + 0.5 * 2.0)
    assert [state.observe_lr(sched, x) for x in (1.0, 2.0, 1.9, 1.7, 0.5)] == [False, False, False, True, False]
    assert state.budget(sched, BASE) is RAISED and ScheduleState().budget(sched, BASE) is BASE
    assert ScheduleState.from_json(state.to_json()) == state


def test_config_errors():
    with pytest.raises(ValueError, match="raised_budget"):
        PrecisionSchedule(lr_decay=0.1)
    with pytest.raises(ValueError, match="loss_spike"):
        PrecisionSchedule(loss_spike=0.0)
    with pytest.raises(ValueError, match="lr_decay"):
        PrecisionSchedule(lr_decay=1.5, raised_budget=RAISED)
    with pytest.raises(ValueError, match="drift"):
        PrecisionSchedule(drift=0.0)
    with pytest.raises(ValueError, match="min_interval"):
        PrecisionSchedule(drift=0.1, min_interval=0)
    with pytest.raises(ValueError, match="min_interval .20. exceeds interval .10."):
        PlannerConfig(interval=10, schedule=PrecisionSchedule(drift=0.1, min_interval=20))
    PlannerConfig(interval=10, schedule=PrecisionSchedule(min_interval=20))  # without drift it is not used


def test_spacing_halves_while_plans_go_stale_and_doubles_while_they_hold():
    sched, state, steps = PrecisionSchedule(drift=0.1, min_interval=4), ScheduleState(), []
    for step, regret in ((0, None), (4, 0.05), (12, 0.5), (16, 0.2), (20, 0.0), (28, 0.0), (44, 0.0), (69, 0.0)):
        assert step == (state.next_step or 0)
        state.space_replans(sched, 25, step, regret)
        steps.append((state.spacing, state.next_step))
    # first plan: min_interval; held: x2; stale: /2 (not below min_interval); capped at the interval
    assert steps == [(4, 4), (8, 12), (4, 16), (4, 20), (8, 28), (16, 44), (25, 69), (25, 94)]
    assert ScheduleState.from_json(state.to_json()) == state


def _objective_by_hand(planner, plan, stats):
    c = planner.config
    if c.method == "snip":
        term = lambda s, g, p: gemm_objective(s, g, p, stats.loss, c.lam, c.terms)  # noqa: E731
    else:
        term = baseline_objective(c.method, stats, "fp4", granularity=c.granularity)
    chosen = plan.assignment()
    return sum(term(s, g, chosen[(s.name, g)]) for s in stats.layers for g in GEMMS)


@pytest.mark.parametrize("method", ["snip", "min_abs_error", "first_last"])
def test_regret_is_the_old_plans_excess_objective_under_the_new_statistics(method):
    planner, _ = setup(None)
    planner.config = PlannerConfig(budget=BASE, method=method, **FAST)
    old = planner.solve(planner.measure(batch(0)))
    stats = planner.measure(batch(1))
    new = planner.solve(stats)
    f_old, f_new = _objective_by_hand(planner, old, stats), _objective_by_hand(planner, new, stats)
    assert planner.objective(new, stats) == pytest.approx(f_new, rel=1e-12) and f_new > 0
    assert f_old >= f_new * (1 - 1e-9)  # the new plan is the optimum of its own objective
    assert planner.regret(old, new, stats) == pytest.approx(max(0.0, f_old / f_new - 1), rel=1e-9, abs=1e-15)
    assert planner.regret(new, new, stats) == 0.0
    # a plan that puts more in FP4 than the budget needs regrets nothing it could have had cheaper
    everything = dataclasses.replace(new, precisions={n: "fp4" for n in new.precisions})
    if method != "first_last":
        assert planner.regret(everything, new, stats) > 0


def test_drift_spaces_the_re_plans():
    """Plans that hold (the measured regrets, below a threshold of 1e9): the spacing doubles from min_interval
    up to the interval; plans that all went stale (a regret of 1 reported): it stays at min_interval. The
    regrets are in the history, the spacing in the checkpoint."""
    for stale, want in ((False, [0, 2, 6, 14, 22, 30]), (True, [0, 2, 4, 6, 8, 10, 12, 14, 16])):
        planner, _ = setup(PrecisionSchedule(drift=1.0 if stale else 1e9, min_interval=2), interval=8)
        if stale:
            planner.regret = lambda old, new, stats: 1.5
        steps = [s for s in range(17 if stale else 31) if planner.step(s, batch(s)) is not None]
        assert steps == want
        regrets = [h["regret"] for h in planner.history[1:]]
        assert len(regrets) == len(steps) - 1 and all(r >= 0 and math.isfinite(r) for r in regrets)
        assert "regret" not in planner.history[0] and (not stale or set(regrets) == {1.5})
        again, _ = setup(PrecisionSchedule(drift=1.0 if stale else 1e9, min_interval=2), interval=8)
        again.load_state_dict(planner.state_dict())
        assert again.schedule_state == planner.schedule_state
        assert next(s for s in range(steps[-1] + 1, 99) if again.due(s)) == planner.schedule_state.next_step
