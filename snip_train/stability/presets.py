"""Named sweep grids.

CPU (2 cores, tiny Llama: 0.8M parameters, 8 x 64 tokens per step). An eXmY step costs ~0.2 s on one
idle core, because every GEMM operand is cast in PyTorch; an FP32 step costs ~0.08 s. Workers run one
per core:

* "cpu-quick": 6 precisions x 4 learning rates x 2 seeds, 60 steps. A smoke test of a precision plan:
  234 s for the whole `snip sweep --preset cpu-quick` on 2 idle cores
  (bench/results/cpu-stability-quick-2026-11-23.md).
* "cpu":       the bit-reduction measurement. E8M7 (the bf16 layout) down to E8M2, plus E5M2 and E4M3,
  against FP32, x 4 learning rates x 3 seeds, 100 steps. ~20 min on 2 idle cores; 74 min on the shared
  VM (bench/results/cpu-stability-*.md).
* "cpu-paper": the stability paper's method. Its simulation (mantissa bits masked, exponent range
  clipped, no scaling: `planner.stability.paper_scheme`, names "eXmY:trunc") for E8M7 down to E8M1,
  then the exponent steps E7M2 and E6M2, against FP32; its epsilon-sharpness (eps 1e-3) recorded next
  to ours at every measurement. E7M2/E6M2 keep E8M2's two mantissa bits, so E8M2 -> E7M2 -> E6M2 (and
  E5M2 of the other presets) removes exponent bits only. Scaled to fit ~45 min of one core of the
  shared VM (an eXmY step cost ~1 s there, 5-8x the idle cost): the setup of "cpu-quick" (60 steps; so
  its RNE cells of E8M7/E8M3/E8M1 at the same seeds start from the same weights and see the same
  batches), 2 of its 4 learning rates, 2 seeds. The two are 0.01, where the narrow-exponent formats of
  "cpu-quick" already fail, and 0.1, where its E8 formats start to.

GPU (run with `--device cuda --workers N`; for models this small several workers can share one GPU).
These grids have not been run yet (no GPU has been available). Their costs are estimates, and their
learning rates are the usual range for these model sizes; they may need shifting to bracket the FP32
stability edge:

* "gpu":       the 25M-parameter "small" Llama, 256-token sequences, 32 per batch, 1000 steps, the
  whole ladder E8M7 .. E8M1, E5M2, E4M3, E3M2, E2M1 plus tensor-scaled E5M2/E4M3 and SR E4M3/E2M1,
  x 6 learning rates x 5 seeds (480 cells). Estimate: ~1-2 min per cell, so roughly 4-8 h on one
  H100 with 4 workers.
* "gpu-1b":    the 1B Llama shape, 2048-token sequences, 2000 steps, a shorter ladder x 3 learning
  rates x 3 seeds (63 cells), one worker per GPU. Estimate: ~100 GPU-hours. FP32 weights, AdamW state
  and activations should fit in 80 GB; untested.

The CPU learning rates bracket the tiny model's FP32 stability edge. At 100 steps, FP32 trains at
0.2; at 0.15-0.3 it jumps to ~12 nats during warmup and then recovers to ~3.0-3.5.
"""

from __future__ import annotations

from planner.stability import EpsilonSharpnessConfig, SharpnessConfig, paper_scheme

from ..model import LlamaConfig
from .cell import BASELINE, TrainingSetup
from .sweep import SweepSpec

__all__ = ["PRESETS", "preset"]

_TINY = LlamaConfig.preset("tiny", max_seq_len=64)
_CPU_LRS = (0.01, 0.03, 0.1, 0.3)


# E8M7 .. E8M1, then the exponent steps at two mantissa bits (see the module docstring)
_PAPER_FORMATS = tuple((8, m) for m in range(7, 0, -1)) + ((7, 2), (6, 2))


def _cpu_paper() -> SweepSpec:
    return SweepSpec(
        precisions=(BASELINE, *(paper_scheme(e, m).label for e, m in _PAPER_FORMATS)),
        learning_rates=(0.01, 0.1),
        seeds=(0, 1),
        setup=TrainingSetup(model=_TINY, steps=60, warmup_steps=6, sharpness_every=20, time_limit_s=240.0,
                            epsilon_sharpness=EpsilonSharpnessConfig()),
    )


def _gpu() -> SweepSpec:
    ladder = ("e8m7", "e8m6", "e8m5", "e8m4", "e8m3", "e8m2", "e8m1", "e5m2", "e4m3", "e3m2", "e2m1")
    variants = ("e5m2:tensor", "e4m3:tensor", "e4m3:sr", "e2m1:sr:tensor")
    return SweepSpec(
        precisions=(BASELINE, *ladder, *variants),
        learning_rates=(3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1),
        seeds=(0, 1, 2, 3, 4),
        setup=TrainingSetup(
            model=LlamaConfig.preset("small", max_seq_len=256), steps=1000, batch_size=32, seq_len=256,
            warmup_steps=100, eval_batches=4, sharpness_every=100, max_bytes=None, time_limit_s=3600.0,
            sharpness=SharpnessConfig(random_directions=4), device="cuda",
        ),
    )


def _gpu_1b() -> SweepSpec:
    return SweepSpec(
        precisions=(BASELINE, "e8m7", "e8m3", "e8m1", "e5m2", "e4m3", "e4m3:tensor"),
        learning_rates=(3e-4, 1e-3, 3e-3),
        seeds=(0, 1, 2),
        setup=TrainingSetup(
            model=LlamaConfig.preset("1b"), steps=2000, batch_size=8, seq_len=2048, warmup_steps=200,
            eval_batches=4, sharpness_every=200, max_bytes=None, time_limit_s=6 * 3600.0, device="cuda",
        ),
    )


PRESETS = {
    "cpu-quick": lambda: SweepSpec(
        precisions=(BASELINE, "e8m7", "e8m3", "e8m1", "e5m2", "e4m3"),
        learning_rates=_CPU_LRS,
        seeds=(0, 1),
        setup=TrainingSetup(model=_TINY, steps=60, warmup_steps=6, sharpness_every=20, time_limit_s=240.0),
    ),
    "cpu": lambda: SweepSpec(
        precisions=(BASELINE, "e8m7", "e8m6", "e8m5", "e8m4", "e8m3", "e8m2", "e5m2", "e4m3"),
        learning_rates=_CPU_LRS,
        seeds=(0, 1, 2),
        setup=TrainingSetup(model=_TINY, steps=100, warmup_steps=10, sharpness_every=20, time_limit_s=300.0),
    ),
    "cpu-paper": _cpu_paper,
    "gpu": _gpu,
    "gpu-1b": _gpu_1b,
}


def preset(name: str) -> SweepSpec:
    try:
        return PRESETS[name]()
    except KeyError:
        raise ValueError(f"unknown sweep preset {name!r}; choose from {sorted(PRESETS)}") from None
