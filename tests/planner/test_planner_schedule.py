"""The precision schedule: re-plans on a loss spike and at the start of learning-rate decay, a raised budget
after decay or when quantization noise outgrows the gradient's own, its state in the planner's checkpoint."""

import pytest
import torch

from causal_lm import CausalLM
from planner import Budget, DivergenceConfig, PlannerConfig, PrecisionSchedule, SnipPlanner, StatsConfig
from planner.schedule import ScheduleState

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


def test_replans_on_spike_and_decay_with_the_raised_budget():
    planner, opt = setup(PrecisionSchedule(loss_spike=0.2, lr_decay=0.05, raised_budget=RAISED))
    assert planner.step(0, batch()) is not None  # the first plan
    planner.observe_loss(2.0)
    assert planner.step(1, batch()) is None
    planner.observe_loss(3.0)  # a spike: the next step re-plans
    spike = planner.step(2, batch())
    assert spike is not None and planner.history[-1]["why"] == ["loss_spike"]
    assert spike.metrics["fp4_fraction"] >= 0.9 and spike.budget == BASE.to_json()
    opt.param_groups[0]["lr"] = 0.9e-3  # decay starts
    decayed = planner.step(3, batch())
    assert planner.history[-1]["why"] == ["lr_decay"] and decayed.budget == RAISED.to_json()
    assert planner.step(4, batch()) is None  # no new trigger
    state = planner.state_dict()
    again, _ = setup(PrecisionSchedule(loss_spike=0.2, lr_decay=0.05, raised_budget=RAISED))
    again.load_state_dict(state)
    assert again.schedule_state == planner.schedule_state and again.schedule_state.decayed


def test_noise_ratio_raises_the_budget():
    """An enormous threshold: the quantization noise is 'above' the gradient noise at once, so the first plan
    is made at the raised budget; a tiny one never fires. The gradient noise is measured and positive."""
    loud, _ = setup(PrecisionSchedule(noise_ratio=1e12, raised_budget=RAISED))
    plan = loud.step(0, batch())
    assert plan.budget == RAISED.to_json() and loud.schedule_state.noisy
    assert plan.stats.diagnostics["gradient_noise_loss"] > 0
    quiet, _ = setup(PrecisionSchedule(noise_ratio=1e-12, raised_budget=RAISED))
    assert quiet.step(0, batch()).budget == BASE.to_json() and not quiet.schedule_state.noisy
