"""snip in torchtitan (0.3.0): the converter on its debug Llama, a plan file, the live planner between
optimizer steps (torchtitan's model, optimizer builder and loss), and the job configs found by name.

torchtitan's whole Trainer is not run here: its debug job reads a tokenizer and a dataset from
torchtitan's source tree, which the package does not ship. On the CPU the debug Llama's FlexAttention
has no backward, so the tests swap it for torchtitan's SDPA attention (causal, no masks)."""

import math

import pytest
import torch

pytest.importorskip("torchtitan")

from torchtitan.components.loss import CrossEntropyLoss  # noqa: E402
from torchtitan.components.optimizer import default_adamw  # noqa: E402
from torchtitan.config import ConfigManager  # noqa: E402
from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention  # noqa: E402
from torchtitan.models.common.linear import Linear  # noqa: E402
from torchtitan.models.llama3 import model_registry  # noqa: E402
from torchtitan.models.llama3.config_registry import llama3_debugmodel  # noqa: E402

from planner import Plan  # noqa: E402
from planner.integrations.torchtitan import (  # noqa: E402
    SnipLinearConverter, SnipPlanning, SnipTrainer, TitanSnipLinear, snip_planner)
from snip_ops import LinearPrecision  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 2048  # the debug model's
PROJECTIONS = 30  # 6 blocks x (wqkv, wo, w1, w2, w3)


def build(converter: SnipLinearConverter.Config | None, seed: int = 0) -> torch.nn.Module:
    """The debug Llama built the way torchtitan's Trainer builds it: on the meta device, then
    materialised on the CPU and initialised by `init_weights`."""
    config = model_registry("debugmodel", converters=[converter] if converter else None).model
    for _, _, parent, attr in list(config.traverse(FlexAttention.Config)):
        setattr(parent, attr, ScaledDotProductAttention.Config())
    with torch.device("meta"):
        model = config.build()
    model.verify_module_protocol()
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    return model.train()


CROSS_ENTROPY = CrossEntropyLoss.Config(global_vocab_size=VOCAB).build()


def loss_fn(model, window):
    """torchtitan's training loss of a token window [B, T+1]: sum over tokens / number of tokens."""
    labels = window[:, 1:]
    loss, _ = CROSS_ENTROPY(model(window[:, :-1]), labels, torch.tensor(labels.numel()))
    return loss


def windows(n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (2, 17), generator=gen) for _ in range(n)]


def precisions(model) -> dict[str, LinearPrecision]:
    return {n: m.precision for n, m in model.named_modules() if isinstance(m, TitanSnipLinear)}


def test_converter_swaps_the_projections_and_keeps_state_dict_and_init():
    model = build(SnipLinearConverter.Config(plan="fp8"))
    assert len(precisions(model)) == PROJECTIONS
    assert set(map(str, precisions(model).values())) == {"fp8"}
    assert type(model.lm_head) is Linear  # the output head stays high precision
    layer = model.get_submodule("layers.0.attention.wo")
    assert [n for n, _ in layer.named_parameters()] == ["weight"] and layer.sr_step.device.type == "cpu"
    assert len({m.seed for m in model.modules() if isinstance(m, TitanSnipLinear)}) == PROJECTIONS
    # init_states used each replaced Linear.Config's param_init: the same parameters, bit for bit
    plain = build(None)
    assert list(model.state_dict()) == list(plain.state_dict())
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in model.state_dict().items())


def test_plan_file_sets_each_layer_and_bad_plans_fail(tmp_path):
    names = list(precisions(build(SnipLinearConverter.Config())))
    plan = Plan({names[0]: "fp4", names[1]: {"fprop": "fp8", "dgrad": "fp4", "wgrad": "fp8"}, names[2]: "fp8"})
    plan.save(tmp_path / "plan.json")
    model = build(SnipLinearConverter.Config(plan=str(tmp_path / "plan.json")))
    got = precisions(model)
    assert {n: got[n] for n in plan.precisions} == dict(plan.precisions)
    assert all(got[n].is_bf16 for n in names[3:])  # not in the plan: bf16

    Plan({"layers.0.attention.wq": "fp4"}).save(tmp_path / "other.json")
    with pytest.raises(ValueError, match="not converted Linear layers"):
        model_registry("debugmodel", converters=[SnipLinearConverter.Config(plan=str(tmp_path / "other.json"))])
    with pytest.raises(FileNotFoundError):
        SnipLinearConverter.Config(plan=str(tmp_path / "missing.json")).build()
    with pytest.raises(ValueError):
        SnipLinearConverter.Config(plan="fp5").build()
    with pytest.raises(ValueError, match="no Linear layer"):
        model_registry("debugmodel", converters=[SnipLinearConverter.Config(filter_fqns=["*"])])


def test_planner_changes_precisions_between_optimizer_steps():
    model = build(SnipLinearConverter.Config())
    optimizers = default_adamw(lr=1e-3).build(model_parts=[model])
    planner = snip_planner([model], optimizers, SnipPlanning(interval=2).planner_config(), loss_fn)
    assert planner.optimizer is optimizers.optimizers[0]  # the AdamW inside torchtitan's container
    assert set(planner.layers) == set(precisions(model)) and all(p.is_bf16 for p in precisions(model).values())
    installed = []
    for step, window in enumerate(windows(3)):
        plan = planner.step(step, window)
        if plan is not None:
            assert precisions(model) == dict(plan.precisions)
            installed.append(plan)
        counters = {n: m.sr_step.item() for n, m in model.named_modules() if isinstance(m, TitanSnipLinear)}
        loss = loss_fn(model, window)
        loss.backward()
        optimizers.step()
        optimizers.zero_grad()
        assert math.isfinite(loss.item())
        # the step ran in the installed precisions: every low-precision layer's forward counted once
        for name, precision in precisions(model).items():
            assert model.get_submodule(name).sr_step.item() - counters[name] == (0 if precision.is_bf16 else 1)
    assert [p.step for p in installed] == [0, 2]
    assert "no Adam state" in installed[0].stats.preconditioner
    assert "no Adam state" not in installed[1].stats.preconditioner  # step 2 read AdamW's moments
    for plan in installed:
        assert plan.metrics["fp4_fraction"] >= 0.75
        assert not all(p.is_bf16 for p in plan.precisions.values())


def test_planner_needs_converted_layers_in_one_model_part():
    model = build(SnipLinearConverter.Config())
    optimizers = default_adamw(lr=1e-3).build(model_parts=[model])
    config = SnipPlanning().planner_config()
    with pytest.raises(ValueError, match="pipeline parallelism"):
        snip_planner([model, model], optimizers, config, loss_fn)
    other = torch.optim.SGD([model.get_submodule("layers.0.attention.wo").weight], lr=0.1)
    with pytest.raises(ValueError, match="no single optimizer"):
        snip_planner([model], other, config, loss_fn)
    plain = build(None)  # the converter is not listed
    with pytest.raises(ValueError, match="SnipLinearConverter"):
        snip_planner([plain], default_adamw().build(model_parts=[plain]), config, loss_fn)


def test_job_configs_are_found_by_name():
    manager = ConfigManager()
    config = manager.parse_args(["--module", "planner.integrations.torchtitan", "--config",
                                 "llama3_debugmodel_snip_planner", "--snip.interval", "3", "--snip.budget", "cost=0.4"])
    assert isinstance(config, SnipTrainer.Config) and config.snip.interval == 3
    assert config.snip.planner_config().budget.kind == "relative_cost"
    layers = [c for _, c, _, _ in config.model_spec.model.traverse(Linear.Config)]
    assert sum(isinstance(c, TitanSnipLinear.Config) for c in layers) == PROJECTIONS
    assert config.training.disable_cuda_graphs
    fixed = manager.parse_args(["--module", "planner.integrations.torchtitan", "--config", "llama3_debugmodel_snip_fp8"])
    assert {c.precision for _, c, _, _ in fixed.model_spec.model.traverse(TitanSnipLinear.Config)} == {"fp8"}


def test_planning_options_are_checked_with_the_job_config():
    with pytest.raises(ValueError, match="cannot parse budget"):
        SnipPlanning(budget="fp4:0.75")
    with pytest.raises(ValueError, match="interval"):
        SnipPlanning(interval=0)
    with pytest.raises(ValueError, match="disable_cuda_graphs"):
        SnipTrainer.Config.of(llama3_debugmodel())
