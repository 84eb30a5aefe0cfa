"""Branching from a training state (snip_train.state, train(start=..., stop_at=...)): a run of N steps is,
bit for bit, a run stopped at W plus a run of the rest started from its state."""

import pickle

import pytest
import torch

from snip_train.model import LlamaConfig
from snip_train.train import TrainConfig, train

pytestmark = pytest.mark.usefixtures("one_thread")

# A two-block model on 2 x 16-token batches: seconds per run, every code path of the tiny preset.
MODEL = LlamaConfig(dim=64, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=128, max_seq_len=16)
RUN = dict(model=MODEL, steps=7, batch_size=2, seq_len=16, max_bytes=1 << 20, eval_batches=1, eval_interval=2,
           progress=False)
W = 3  # on no evaluation step (eval_interval 2): the branch's extra evaluation at W must leave no trace


def _same_tensors(a, b) -> bool:
    """Equal keys, and equal values: tensors bit for bit (and of one dtype), anything else by ==."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)


@pytest.mark.parametrize("precision,weights", [("bf16", "fp32"), ("fp4", "fp32"), ("bf16", "bf16_sr")])
def test_a_branch_continues_the_run_bit_for_bit(precision, weights):
    cfg = TrainConfig(precision=precision, weights=weights, **RUN)
    whole = train(cfg, stop_at=cfg.steps)
    head = train(cfg, stop_at=W)
    rest = train(cfg, start=head["state"], stop_at=cfg.steps)
    assert head["steps"] == W and rest["start_step"] == W and rest["steps"] == cfg.steps - W
    joined = head["history"]["train"]["loss"] + rest["history"]["train"]["loss"]
    assert joined == whole["history"]["train"]["loss"]
    assert head["history"]["train"]["lr"] + rest["history"]["train"]["lr"] == whole["history"]["train"]["lr"]
    assert rest["final_val_loss"] == whole["final_val_loss"]
    assert _same_tensors(rest["state"].model, whole["state"].model)
    assert rest["state"].sr_counters == whole["state"].sr_counters
    if precision == "fp4":  # the SR counters moved, and only training moved them
        assert set(whole["state"].sr_counters.values()) == {cfg.steps}
    moments = lambda s: {f"{i}.{k}": v for i, st in s.optimizer["state"].items() for k, v in st.items()}  # noqa: E731
    assert _same_tensors(moments(rest["state"]), moments(whole["state"]))


def test_branches_share_no_tensor_and_leave_the_state_as_it_was():
    cfg = TrainConfig(precision="fp4", **RUN)
    state = train(cfg, stop_at=W)["state"]
    before = pickle.loads(pickle.dumps(state))  # a deep copy
    first = train(cfg, start=state)
    second = train(cfg, start=state)
    assert first["history"]["train"]["loss"] == second["history"]["train"]["loss"]
    assert _same_tensors(state.model, before.model) and state.sr_counters == before.sr_counters
    assert torch.equal(state.optimizer["state"][0]["exp_avg"], before.optimizer["state"][0]["exp_avg"])
    # a state survives pickling (the comparison sends it to worker processes) and still branches the same
    assert train(cfg, start=before)["history"]["train"]["loss"] == first["history"]["train"]["loss"]


def test_reseeded_data_order():
    cfg = TrainConfig(**RUN)
    state = train(cfg, stop_at=W)["state"]
    same = train(cfg, start=state)["history"]["train"]["loss"]
    a = train(cfg, start=state.reseed_data(5))["history"]["train"]["loss"]
    b = train(cfg, start=state.reseed_data(5))["history"]["train"]["loss"]
    assert a == b and a != same and a[0] != same[0]  # other batches from the first branch step on


def test_evaluation_leaves_no_trace_on_training():
    often = train(TrainConfig(precision="fp4", **{**RUN, "eval_interval": 1}))["history"]["train"]["loss"]
    never = train(TrainConfig(precision="fp4", **{**RUN, "eval_interval": 0}))["history"]["train"]["loss"]
    assert often == never


def test_a_branch_from_a_bf16_state_may_change_precision():
    cfg = TrainConfig(**RUN)
    state = train(cfg, stop_at=W)["state"]
    assert state.sr_counters == {}  # plain nn.Linear
    low = train(TrainConfig(precision="fp4", **RUN), start=state, stop_at=RUN["steps"])
    assert set(low["state"].sr_counters.values()) == {RUN["steps"] - W}  # counted from the branch point


def test_steps_out_of_range():
    cfg = TrainConfig(**RUN)
    with pytest.raises(ValueError, match="cannot go from step"):
        train(cfg, stop_at=cfg.steps + 1)
    state = train(cfg, stop_at=W)["state"]
    with pytest.raises(ValueError, match="cannot go from step"):
        train(cfg, start=state, stop_at=W - 1)
    assert "state" not in train(cfg, start=state)  # only a run given stop_at hands its state back
