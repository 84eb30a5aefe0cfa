"""Job configs for torchtitan's launcher, found by name like its own config registries:

    python -m torchtitan.train --module planner.integrations.torchtitan --config llama3_debugmodel_snip_planner

`llama3_debugmodel_snip_fp8`: the debug Llama with every projection in FP8 (a fixed plan).
`llama3_debugmodel_snip_planner`: the debug Llama trained by SnipTrainer, re-planning every 5 steps,
without activation checkpointing and with an unchunked cross-entropy (what SnipTrainer needs, see
trainer.py).
Both disable CUDA graphs: a captured graph replays its capture's stochastic-rounding offsets.
"""

from torchtitan.components.loss import CrossEntropyLoss
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_debugmodel
from torchtitan.trainer import Trainer

from .converter import SnipLinearConverter
from .trainer import SnipPlanning, SnipTrainer

__all__ = ["llama3_debugmodel_snip_fp8", "llama3_debugmodel_snip_planner"]


def llama3_debugmodel_snip_fp8() -> Trainer.Config:
    config = llama3_debugmodel()
    config.model_spec = model_registry("debugmodel", converters=[SnipLinearConverter.Config(plan="fp8")])
    config.training.disable_cuda_graphs = True
    return config


def llama3_debugmodel_snip_planner() -> SnipTrainer.Config:
    config = llama3_debugmodel()
    config.model_spec = model_registry("debugmodel", converters=[SnipLinearConverter.Config()])
    config.training.disable_cuda_graphs = True
    config.activation_checkpoint = None
    config.loss = CrossEntropyLoss.Config(global_vocab_size=decoder_vocab_size(config.model_spec))
    return SnipTrainer.Config.of(config, SnipPlanning(interval=5))
