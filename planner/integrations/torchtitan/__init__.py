"""snip for torchtitan (0.3.0): `SnipLinearConverter` (a fixed plan, or bf16 layers for a planner),
`SnipTrainer` (the planner between steps) and job configs found by name (`config_registry`).

    from planner.integrations.torchtitan import SnipLinearConverter, SnipPlanning, SnipTrainer
    model_spec = model_registry("debugmodel", converters=[SnipLinearConverter.Config(plan="plan.json")])
"""

from .converter import SnipLinearConverter, TitanSnipLinear
from .trainer import SnipPlanning, SnipTrainer, snip_planner

__all__ = ["SnipLinearConverter", "SnipPlanning", "SnipTrainer", "TitanSnipLinear", "snip_planner"]
