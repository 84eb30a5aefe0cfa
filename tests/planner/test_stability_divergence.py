"""When a run counts as diverged and what counts as a spike (planner.stability.divergence)."""

import math

from planner.stability import DivergenceRule, LossMonitor


def test_loss_monitor_rules():
    rule = DivergenceRule(blowup_nats=1.0, blowup_patience=3, spike_ratio=1.5)
    m = LossMonitor(rule, initial_loss=5.0)
    assert not any(m.update(i, v) for i, v in enumerate([5.0, 4.0, 3.0, 9.0, 3.0, 2.9], start=1))
    assert m.spike_steps == [4] and m.reason is None                      # a spike that recovers
    m = LossMonitor(rule, initial_loss=5.0)
    assert [m.update(i, 60.0) for i in range(1, 4)] == [False, False, True] and m.reason == "blow-up"
    m = LossMonitor(rule, initial_loss=5.0)
    assert m.update(1, math.nan) and m.reason == "non-finite"
