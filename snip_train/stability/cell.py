"""One cell of a stability sweep: a short, bounded training run of the small Llama at one
(precision, learning rate, seed), recording loss, divergence, spikes and sharpness over time (ours, and
optionally the stability paper's epsilon-sharpness next to it, as the "epsilon" entry of each measurement).

The loop is the trainer's (`snip_train`: model, data, AdamW with decay on matrices only, warmup +
cosine schedule `lr_at`, gradient clipping) written out here because a sweep needs three things the
general trainer does not do: stop as soon as the run diverges (`LossMonitor`), measure sharpness on
fixed held-out batches between steps, and stop at a wall-clock limit. Within a seed, every precision
and learning rate sees the same initial weights and the same batches, so cells differ only in what
the sweep varies.

Precision names: "fp32" is the unconverted model (float32 GEMMs: the high-precision baseline); a name
with explicit widths ("e8m3", "e4m3:sr:tensor", see `exmy.parse_scheme`) is an eXmY simulation;
anything else goes to the trainer's plan resolution (`train.resolve_plan`: "fp8", "fp4",
"mxfp8", "fp4_mlp", a plan JSON file, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import re
import time
import zlib
from dataclasses import dataclass, field
from typing import Any

import torch

from planner.stability import (
    DivergenceRule, EpsilonSharpnessConfig, LossMonitor, SharpnessConfig, epsilon_sharpness, measure_sharpness,
    parse_scheme,
)
from snip_ops import SnipLinear, convert

from ..data import TokenData
from ..model import Llama, LlamaConfig
from ..train import TrainConfig, apply_precision, lr_at, resolve_device

__all__ = ["BASELINE", "TrainingSetup", "Cell", "run_cell", "is_exmy_name"]

BASELINE = "fp32"
_EXMY_NAME = re.compile(r"^e\d+m\d+")
_HELD_OUT_SEED = 0x5EED  # the trainer's validation seed: the same held-out windows for every cell
_OPTIONAL_MEASUREMENTS = ("epsilon_sharpness",)


@dataclass(frozen=True)
class TrainingSetup:
    """Everything about a cell's run except what the sweep varies (precision, learning rate, seed)."""

    model: LlamaConfig = LlamaConfig.preset("tiny", max_seq_len=64)
    steps: int = 100
    batch_size: int = 8
    seq_len: int = 64
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0
    corpus: str | None = None           # None: the Python stdlib sources (snip_train.data)
    max_bytes: int | None = 4 * 1024 * 1024  # None: the whole corpus
    eval_batches: int = 2               # held-out batches for the final loss and for sharpness
    sharpness_every: int = 20           # measure every this many steps (and at the end); 0: never
    sharpness: SharpnessConfig = SharpnessConfig()
    # the stability paper's epsilon-sharpness, measured at the same steps next to ours (None: not measured)
    epsilon_sharpness: EpsilonSharpnessConfig | None = None
    divergence: DivergenceRule = DivergenceRule()
    time_limit_s: float = 600.0         # a cell that runs longer stops, incomplete (not part of the key)
    device: str = "cpu"

    def __post_init__(self):
        if self.seq_len > self.model.max_seq_len:
            raise ValueError(f"seq_len {self.seq_len} exceeds the model's max_seq_len {self.model.max_seq_len}")
        if self.steps < 1 or self.batch_size < 1 or self.eval_batches < 1:
            raise ValueError("steps, batch_size and eval_batches must be >= 1")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Cell:
    precision: str
    lr: float
    seed: int
    setup: TrainingSetup = field(default_factory=TrainingSetup)

    def to_json(self) -> dict[str, Any]:
        return {"precision": self.precision, "lr": self.lr, "seed": self.seed, "setup": self.setup.to_json()}

    def key(self) -> str:
        """The name of the cell's result file (resumability): a hash of everything that determines the
        run's outcome -- the whole configuration but the time limit, which only bounds it. An optional
        measurement that is off (None) is left out as well, so cells recorded without it keep their key."""
        identity = self.to_json()
        identity["setup"] = {k: v for k, v in identity["setup"].items()
                             if k != "time_limit_s" and not (k in _OPTIONAL_MEASUREMENTS and v is None)}
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def is_exmy_name(precision: str) -> bool:
    return bool(_EXMY_NAME.match(precision.lower()))


def _convert(model: torch.nn.Module, precision: str, seed: int) -> torch.nn.Module:
    if precision == BASELINE:
        return model
    if is_exmy_name(precision):
        model = convert(model, parse_scheme(precision).precision())
    else:
        model = apply_precision(model, precision)
    # Stochastic rounding varies with the run's seed as the initial weights and the data do.
    for name, mod in model.named_modules():
        if isinstance(mod, SnipLinear):
            mod.seed = zlib.crc32(f"{name}/{seed}".encode())
    return model


@functools.lru_cache(maxsize=4)
def _token_data(corpus: str | None, max_bytes: int | None) -> TokenData:
    return TokenData.from_path(corpus, max_bytes=max_bytes)


@torch.no_grad()
def _held_out_loss(model: torch.nn.Module, batches: list[torch.Tensor]) -> float:
    was_training = model.training
    model.eval()
    loss = sum(float(model.loss(b)) for b in batches) / len(batches)
    model.train(was_training)
    return loss


def _finite_or_none(v: float) -> float | None:
    return v if math.isfinite(v) else None


def run_cell(cell: Cell) -> dict[str, Any]:
    """Train one cell and return its record (plain Python data; non-finite losses as None)."""
    setup = cell.setup
    t_start = time.perf_counter()
    device = resolve_device(setup.device)
    data = _token_data(setup.corpus, setup.max_bytes)
    held_out_gen = torch.Generator().manual_seed(_HELD_OUT_SEED)
    held_out = [data.get_batch("val", setup.batch_size, setup.seq_len, held_out_gen).to(device)
                for _ in range(setup.eval_batches)]

    torch.manual_seed(cell.seed)
    model = _convert(Llama(setup.model), cell.precision, cell.seed).to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": setup.weight_decay},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=cell.lr, betas=setup.betas,
    )
    schedule = TrainConfig(steps=setup.steps, lr=cell.lr, min_lr_ratio=setup.min_lr_ratio)
    train_gen = torch.Generator().manual_seed(cell.seed)
    losses: list[float] = []
    sharpness_log: list[dict[str, Any]] = []
    initial_loss = _held_out_loss(model, held_out)
    monitor = LossMonitor(setup.divergence, initial_loss)

    sharpness_s = epsilon_s = 0.0

    def record_sharpness(step: int) -> None:
        nonlocal sharpness_s, epsilon_s
        t = time.perf_counter()
        ours = measure_sharpness(model, held_out, setup.sharpness, seed=cell.seed)
        entry = {"step": step, **{d: r.to_json() for d, r in ours.items()}}
        if setup.epsilon_sharpness is not None:
            t_epsilon = time.perf_counter()
            entry["epsilon"] = epsilon_sharpness(model, held_out, setup.epsilon_sharpness, seed=cell.seed).to_json()
            epsilon_s += time.perf_counter() - t_epsilon
        sharpness_log.append(entry)
        sharpness_s += time.perf_counter() - t

    status = "complete"
    t_train = time.perf_counter()
    for step in range(setup.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, schedule, setup.warmup_steps)
        batch = data.get_batch("train", setup.batch_size, setup.seq_len, train_gen).to(device)
        loss = model.loss(batch)
        loss.backward()
        if setup.grad_clip:
            torch.nn.utils.clip_grad_norm_(params, setup.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if monitor.update(step + 1, losses[-1]):
            status = "diverged"
            break
        done = step + 1
        if setup.sharpness_every and done % setup.sharpness_every == 0 and done < setup.steps:
            record_sharpness(done)
        if time.perf_counter() - t_start > setup.time_limit_s:
            status = "time_limit"
            break
    steps_done = len(losses)
    train_s = time.perf_counter() - t_train - sharpness_s
    if setup.sharpness_every and status != "diverged":
        record_sharpness(steps_done)
    final_loss = _held_out_loss(model, held_out) if status != "diverged" or monitor.reason == "blow-up" else math.nan
    tail = [v for v in losses[-10:] if math.isfinite(v)]
    return {
        "key": cell.key(),
        "cell": cell.to_json(),
        "status": status,
        "diverged_online": status == "diverged",
        "divergence_reason": monitor.reason,
        "steps": steps_done,
        "initial_loss": initial_loss,
        "final_loss": _finite_or_none(final_loss),
        "final_train_loss": sum(tail) / len(tail) if tail else None,
        "spikes": len(monitor.spike_steps),
        "spike_steps": monitor.spike_steps,
        "train_loss": [_finite_or_none(v) for v in losses],
        "sharpness": sharpness_log,
        "time_s": time.perf_counter() - t_start,
        "step_time_s": train_s / max(1, steps_done),
        "sharpness_time_s": sharpness_s,            # both metrics
        "epsilon_sharpness_time_s": epsilon_s,      # the paper's alone
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
    }
