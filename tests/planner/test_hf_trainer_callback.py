"""SnipCallback in Hugging Face transformers' Trainer: a tiny Llama (random weights from a config, no
download) trained for a few steps on the CPU; the planner runs between steps, installs its plans, the
next step uses them and the plan file is written."""

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers.Trainer needs it

from planner import DivergenceConfig, Plan, PlannerConfig, StatsConfig  # noqa: E402
from planner.integrations.hf_trainer import SnipCallback, model_loss  # noqa: E402
from snip_ops import SnipLinear  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = dict(stats=StatsConfig(max_rows=64), divergence=DivergenceConfig(draws=1))


def tiny_llama():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


def dataset(n=8, length=16, labels=True):
    gen = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 128, (length,), generator=gen) for _ in range(n)]
    return [{"input_ids": r, "labels": r} if labels else {"input_ids": r} for r in rows]


def precisions(model):
    return {n: m.precision for n, m in model.named_modules() if isinstance(m, SnipLinear)}


class PrecisionsAtStepBegin(transformers.TrainerCallback):
    """Records the precisions each optimizer step starts with."""

    def __init__(self):
        self.seen = []

    def on_step_begin(self, args, state, control, model=None, **kwargs):
        self.seen.append(precisions(model))


def test_callback_replans_between_steps_and_writes_the_plan(tmp_path):
    model = tiny_llama()
    snip = SnipCallback(PlannerConfig(interval=2, **FAST))
    seen = PrecisionsAtStepBegin()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, report_to=[], max_steps=4, per_device_train_batch_size=2,
        learning_rate=1e-3, logging_steps=1, save_strategy="no", seed=0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset(), callbacks=[snip, seen])
    trainer.train()

    planner = snip.planner
    assert len(planner.layers) == 14 and type(model.lm_head) is torch.nn.Linear
    assert [h["step"] for h in planner.history] == [1, 3]  # after steps 1 and 3, before steps 2 and 4
    assert all(p.is_bf16 for p in seen.seen[0].values())  # the first step calibrates: bf16
    assert not all(p.is_bf16 for p in seen.seen[1].values())
    assert seen.seen[1] == seen.seen[2]  # installed after step 1, kept until the re-plan after step 3
    assert seen.seen[3] == precisions(model) == dict(planner.plan.precisions)  # the last step used the last plan
    assert planner.plan.metrics["fp4_fraction"] >= 0.75
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses)
    saved = Plan.load(tmp_path / "snip_plan.json")
    assert saved.precisions == planner.plan.precisions and saved.step == 3
    assert snip._hook is None  # the batch hook is gone after training
    # WD's horizon looks ahead along the Trainer's linear decay, which ends at max_steps
    assert [planner.lr_schedule(s) for s in range(6)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    assert planner._lr_ratios(1) == [1.0, 0.5 / 0.75]


def test_model_loss_needs_labels():
    model = tiny_llama()
    batch = dataset(n=1, labels=False)[0]
    with pytest.raises(ValueError, match="no 'labels'"):
        model_loss(model, {"input_ids": batch["input_ids"][None]})
    ids = batch["input_ids"][None]
    assert torch.equal(model_loss(model, {"input_ids": ids, "labels": ids}), model(input_ids=ids, labels=ids).loss)
