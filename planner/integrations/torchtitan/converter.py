"""`SnipLinearConverter`: torchtitan's `Linear` layers become `TitanSnipLinear` (a `SnipLinear`).

torchtitan (0.3.0) converts models by rewriting the model's config tree before the model is built;
a converter is listed in the model registry exactly like its float8 converter:

    model_spec = model_registry("debugmodel", converters=[SnipLinearConverter.Config(plan="plan.json")])

`plan` is a snip-plan/1 JSON file (`planner.Plan.save`), a named precision for every converted layer
("fp8", "fp4", ...), or None (bf16 until a planner installs a plan, see `SnipTrainer`). The output
head and the embeddings stay as they are (`filter_fqns`, snip_ops' DEFAULT_EXCLUDE by default).
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from typing import Mapping

import torch
from torchtitan.components.quantization import QuantizationConverter
from torchtitan.models.common.linear import Linear
from torchtitan.protocols.module import Module

from snip_ops import LinearPrecision, SnipLinear
from snip_ops.module import DEFAULT_EXCLUDE, layer_seed, plan_for

from ...plan import Plan

__all__ = ["SnipLinearConverter", "TitanSnipLinear"]


class TitanSnipLinear(SnipLinear, Module):
    """A `SnipLinear` that satisfies torchtitan's Module protocol (built from a config, initialised by
    `init_states` with the replaced `Linear.Config`'s `param_init`). Like torchtitan's Float8Linear it
    derives from `Module`, not from `Linear`, whose `__init__` takes a config."""

    @dataclass(kw_only=True, slots=True)
    class Config(Linear.Config):
        precision: str | Mapping[str, str] | None = None  # LinearPrecision.to_json(); None: bf16
        seed: int = 0                                     # the layer's SR seed (from its FQN)
        emulate: bool = False                             # emulated GEMMs even where kernels exist

    def __init__(self, config: Config):
        SnipLinear.__init__(self, config.in_features, config.out_features, config.bias,
                            precision=config.precision, seed=config.seed, emulate=config.emulate)
        # torchtitan builds the model under torch.device("meta") and materialises it with to_empty,
        # which moves parameters and buffers only: the SR step counter (read on the host) is created
        # on the CPU explicitly.
        self.sr_step = torch.zeros((), dtype=torch.int64, device="cpu")


class SnipLinearConverter(QuantizationConverter):
    """Replace every `Linear.Config` of the model config tree (not the excluded ones) by a
    `TitanSnipLinear.Config` with the plan's precision for its FQN."""

    @dataclass(kw_only=True, slots=True)
    class Config(QuantizationConverter.Config):
        plan: str | None = None
        """A snip-plan/1 JSON file, a named precision for every converted layer, or None (bf16)."""

        filter_fqns: list[str] = field(default_factory=lambda: list(DEFAULT_EXCLUDE))
        """fnmatch patterns of Linear FQNs to leave unconverted (default: output head, embeddings)."""

        emulate: bool = False
        """Emulate the low-precision GEMMs even where kernels exist (tests, numerics studies)."""

    def __init__(self, config: Config):
        self.config = config
        self.plan = _load_plan(config.plan)

    def convert(self, model_config):
        cfg = self.config
        converted = []
        for fqn, linear, parent, attr in list(model_config.traverse(Linear.Config)):
            # Subclasses with a forward of their own (e.g. ScaledBiasRowwiseLinear) are left alone.
            if type(linear) not in (Linear.Config, TitanSnipLinear.Config):
                continue
            if any(fnmatch.fnmatchcase(fqn, p) for p in cfg.filter_fqns):
                continue
            new = TitanSnipLinear.Config(
                in_features=linear.in_features, out_features=linear.out_features, bias=linear.bias,
                param_init=linear.param_init, sharding_config=linear.sharding_config,
                precision=plan_for(fqn, self.plan).to_json(), seed=layer_seed(fqn),
                emulate=cfg.emulate)
            converted.append(fqn)
            if parent is None:
                model_config = new
            elif isinstance(parent, list):
                parent[attr] = new
            else:
                setattr(parent, attr, new)
        if not converted:
            raise ValueError("SnipLinearConverter found no Linear layer to convert (check filter_fqns)")
        if isinstance(self.plan, Mapping):
            unknown = sorted(set(self.plan) - set(converted))
            if unknown:
                raise ValueError(f"plan {cfg.plan!r} names layers that are not converted Linear layers of this "
                                 f"model: {unknown[:5]}")
        return model_config


def _load_plan(plan: str | None) -> Mapping[str, LinearPrecision] | LinearPrecision:
    """The precisions of a plan file, or one named precision (a bad name raises here, not at build)."""
    if plan is not None and (plan.endswith(".json") or os.path.sep in plan):
        if not os.path.isfile(plan):
            raise FileNotFoundError(f"snip plan file {plan!r} does not exist")
        return Plan.load(plan).precisions
    return LinearPrecision.of(plan)
