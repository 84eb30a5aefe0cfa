"""The planner chooses NVIDIA's NVFP4 training recipe (`nvfp4_train`) like any other precision: it is
measured with its Hadamard-transformed wgrad, counts as FP4 in the budget, and a plan that uses it
trains."""

import pytest
import torch

from causal_lm import CausalLM
from planner import DivergenceConfig, PlannerConfig, SnipPlanner, StatsConfig
from planner.cost import is_fp4
from snip_ops import SnipLinear

pytestmark = pytest.mark.usefixtures("one_thread")


def test_planner_plans_and_trains_with_the_recipe():
    torch.manual_seed(0)
    model = CausalLM.build(dim=64, n_layers=1, n_heads=2, n_kv_heads=1, ffn_hidden=64, max_seq_len=16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = PlannerConfig(interval=2, candidates=("fp8", "nvfp4_train"), stats=StatsConfig(max_rows=64),
                           divergence=DivergenceConfig(draws=1))
    planner = SnipPlanner(model, opt, config)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for step in range(3):
        batch = torch.randint(0, 256, (2, 17), generator=gen)
        plan = planner.step(step, batch)
        if plan is not None:
            assert plan.metrics["fp4_fraction"] >= 0.75
            errors = plan.stats.layers[0].errors
            assert set(errors) >= {"fp8", "nvfp4_train"} and errors["nvfp4_train"]["wgrad"] > 0
        loss = model.loss(batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    used = {p for m in model.modules() if isinstance(m, SnipLinear) for p in str(m.precision).split("/")}  # per GEMM
    assert "nvfp4_train" in used and used <= {"fp8", "nvfp4_train"}
    assert is_fp4("nvfp4_train")
    assert all(torch.isfinite(torch.tensor(losses)))
