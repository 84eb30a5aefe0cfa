"""snip_train, the application on top of the libraries (snip_ops, planner): a small Llama-like model,
a byte-level data pipeline, a trainer, the planner in that trainer and the bf16 / SNIP / baseline
comparison (``planning``), the stability sweep (``stability``), every picture (``plots``) and the
``snip`` command line (``cli``)."""

from .data import TokenData, load_corpus, stdlib_corpus_bytes
from .model import PRESETS, Llama, LlamaConfig
from .train import PLAN_PRESETS, TrainConfig, apply_precision, resolve_plan, train

__all__ = [
    "Llama", "LlamaConfig", "PRESETS",
    "TokenData", "load_corpus", "stdlib_corpus_bytes",
    "TrainConfig", "train", "PLAN_PRESETS", "resolve_plan", "apply_precision",
]
