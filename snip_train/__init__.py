"""snip_train: a small Llama-like model, a byte-level data pipeline, a trainer and the ``snip`` CLI."""

from .data import TokenData, load_corpus, stdlib_corpus_bytes
from .model import PRESETS, Llama, LlamaConfig
from .train import PLAN_PRESETS, TrainConfig, apply_precision, resolve_plan, train

__all__ = [
    "Llama", "LlamaConfig", "PRESETS",
    "TokenData", "load_corpus", "stdlib_corpus_bytes",
    "TrainConfig", "train", "PLAN_PRESETS", "resolve_plan", "apply_precision",
]
