"""What the planner-quality studies share: the tiny and mini presets' bf16 checkpoints (one trajectory per preset,
its training phases), branches trained from them, the calibration batch the planner measures on, the planner's
statistics at a checkpoint, and the numerics digest that keeps runs of two machines from being paired.

Trained runs and checkpoints are cached under $SNIP_BENCH_CACHE (default: snip-planner-bench in the temporary
directory), so an interrupted study resumes. Every paired comparison subtracts runs that started from one checkpoint
and saw the same batches per seed; runs trained under another CPU's numerics (another machine, or a checkpoint
trained on one) are never paired with this machine's: `check_paired`, `check_cache_numerics`.
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import functools
import hashlib
import math
import os
import statistics
import tempfile
from pathlib import Path

import torch

from experiments.results import RESULTS
from planner import DivergenceConfig, PlannedModel, PlannerStats, StatsConfig, block_index, lm_logits, measure
from snip_ops import SnipLinear, convert
from snip_train.data import TokenData
from snip_train.model import Llama, LlamaConfig
from snip_train.train import TrainConfig, train

CACHE = Path(os.environ.get("SNIP_BENCH_CACHE", Path(tempfile.gettempdir()) / "snip-planner-bench"))
# The branches' setting: batch 8 x 128 tokens of the bundled corpus, AdamW with weight decay 0.1, clipping at 1.
RUN = dict(preset="tiny", batch_size=8, seq_len=128, weight_decay=0.1, grad_clip=1.0, eval_batches=8,
           progress=False, max_bytes=8 * 2**20)
PRE_STEPS = 400  # the "mid-training" checkpoint
PRE_WARMUP = 40  # the checkpoints' warmup: every checkpoint longer than it is a point of one trajectory
# Peak learning rate per preset (the checkpoints' constant rate after warmup; the branches' cosine starts there):
# tiny's 3e-3, scaled as 1 / width for the wider presets (Adam's hidden-layer rate under muP; mini is 3x as wide).
# At 3e-3 mini's paired branches spread 0.02-0.03 nats by method at one seed, uniform FP4 below SNIP's 80% plan
# (bench/results/cpu-planner-quality-mini-signal-lr3e-3.md): chaos, not precision, ranked them.
LRS = {"tiny": 3e-3, "mini": 1e-3}
CALIBRATION_SEED = 7  # the batch every planner measurement of a study is made on (unless it says otherwise)
# the entry of a paired cache that records, per checkpoint "preset/phase", the `numerics` its runs were trained under
CACHE_NUMERICS = "numerics"


def preset_lr(ckpt: dict) -> float:
    return LRS[ckpt.get("preset", "tiny")]


def ints(text: str) -> list[int]:
    """A comma-separated list of integers (argparse type); empty items are skipped."""
    return [int(v) for v in text.split(",") if v]


def floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",") if v]


def mean_se(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error (0 for a single value)."""
    return statistics.mean(values), statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0


def spearman(a, b) -> float:
    from scipy.stats import spearmanr
    return float(spearmanr(a, b).statistic)


def in_block(name: str, block: int | None) -> bool:
    """Whether layer `name` is in transformer block `block` (None: every layer is)."""
    return block is None or block_index(name) == block


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """--threads and --results, which every study takes."""
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: on a shared 2-core machine two threads oversubscribe)")
    p.add_argument("--results", type=Path, default=RESULTS, help="where the results go (default: bench/results)")


# ---------------------------------------------------------------------------------------------
# the checkpoints and branches trained from them
# ---------------------------------------------------------------------------------------------
def checkpoint_path(steps: int, preset: str) -> Path:
    return CACHE / f"ckpt-{preset}-{steps}-lr{LRS[preset]:g}.pt"


@functools.lru_cache(maxsize=4)
def checkpoint(steps: int = PRE_STEPS, preset: str = "tiny") -> dict:
    """The bf16 `preset` model after `steps` steps (constant lr after warmup, seed 1234), with its AdamW state:
    checkpoints of one trajectory at different steps are its training phases. Loaded once per process
    (a worker trains many branches from it); callers copy what they change (`continue_from`)."""
    path = checkpoint_path(steps, preset)
    if path.exists():
        return torch.load(path)
    CACHE.mkdir(parents=True, exist_ok=True)
    box = {}
    summary = train(TrainConfig(**{**RUN, "preset": preset}, steps=steps, lr=LRS[preset], min_lr_ratio=1.0,
                                warmup_steps=PRE_WARMUP if steps > PRE_WARMUP else steps // 2, seed=1234,
                                eval_interval=0, on_setup=lambda m, o: box.update(model=m, opt=o)))
    ckpt = {"preset": preset, "steps": steps, "model": box["model"].state_dict(), "optimizer": box["opt"].state_dict(),
            "val_loss": summary["final_val_loss"], "time_s": summary["time_s"]}
    torch.save(ckpt, path)
    return ckpt


def branch_config(ckpt: dict, steps: int, seed: int, evals: int = 4, eval_batches: int = RUN["eval_batches"],
                  precision=None) -> TrainConfig:
    """The TrainConfig of a branch of `steps` steps from the checkpoint (the callbacks aside): the preset's lr
    decaying along a cosine to a tenth of it at the last step; every evaluation (`evals` of them, plus the one at
    the start) averages `eval_batches` validation batches."""
    return TrainConfig(**{**RUN, "preset": ckpt.get("preset", "tiny"), "eval_batches": eval_batches},
                       steps=steps, lr=preset_lr(ckpt), min_lr_ratio=0.1, warmup_steps=0, seed=seed,
                       eval_interval=max(1, steps // evals) if evals else 0, precision=precision)


def continue_from(ckpt: dict, steps: int, seed: int, precision=None, hooks=None, evals: int = 4,
                  constant_steps: int = 0, eval_batches: int = RUN["eval_batches"]) -> dict:
    """Train `steps` more steps from the checkpoint (`branch_config`), return the summary. With `constant_steps`
    the learning rate stays at the preset's for that many steps first, then decays. `hooks`: an object with
    on_setup(model, opt) and on_step(step, model, batch), called as snip_train.train calls its own."""
    box = {}

    def on_setup(model, opt):
        opt.load_state_dict(copy.deepcopy(ckpt["optimizer"]))  # AdamW would step the checkpoint's tensors in place
        box["opt"] = opt
        if hooks is not None:
            hooks.on_setup(model, opt)

    def prepare(model):
        model.load_state_dict(ckpt["model"])
        return model

    def on_step(step, model, batch):
        if constant_steps:  # the loop set the cosine lr of the whole branch: hold it first, decay after
            t = min(1.0, max(0, step - constant_steps) / max(1, steps - 1 - constant_steps))
            lr = preset_lr(ckpt)
            min_lr = lr * 0.1
            for g in box["opt"].param_groups:
                g["lr"] = min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * t))
        if hooks is not None:
            hooks.on_step(step, model, batch)

    cfg = branch_config(ckpt, steps, seed, evals, eval_batches, precision)
    return train(dataclasses.replace(cfg, prepare_model=prepare, on_setup=on_setup, on_step=on_step))


def model_at(ckpt: dict):
    """(model, AdamW, {name: SnipLinear}) at the checkpoint: the model converted (bf16), the optimizer's state
    restored."""
    model = convert(Llama(LlamaConfig.preset(ckpt.get("preset", "tiny"))))
    model.load_state_dict(ckpt["model"])
    params = list(model.parameters())  # the same two groups as snip_train.train (decay / no decay)
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2]},
                             {"params": [p for p in params if p.dim() < 2]}], lr=preset_lr(ckpt))
    opt.load_state_dict(copy.deepcopy(ckpt["optimizer"]))  # also restores betas, eps, weight decay
    return model, opt, {n: m for n, m in model.named_modules() if isinstance(m, SnipLinear)}


def calibration_batch(seed: int = CALIBRATION_SEED) -> torch.Tensor:
    data = TokenData.from_path(None, max_bytes=RUN["max_bytes"])
    return data.get_batch("train", RUN["batch_size"], RUN["seq_len"], torch.Generator().manual_seed(seed))


def stats_at(ckpt: dict, draws: int, candidates=("fp8", "fp4"), method: str = "auto", wd_horizon: int | None = None,
             calibration_seed: int = CALIBRATION_SEED) -> PlannerStats:
    """The planner's statistics at the checkpoint, as SnipPlanner measures them (the Fisher curvature from the
    logits unless `method` says otherwise; WD settled unless `wd_horizon` gives its steps)."""
    model, opt, layers = model_at(ckpt)
    config = DivergenceConfig(draws=draws, method=method, wd_horizon=wd_horizon)
    return measure(PlannedModel(model, layers, opt, lambda m, b: m.loss(b), lm_logits),
                   calibration_batch(calibration_seed), candidates, StatsConfig(), config)


# ---------------------------------------------------------------------------------------------
# numerics: runs of two machines are never paired
# ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def numerics(phase: int, preset: str = "tiny", threads: int = 1) -> str:
    """A digest of the bits this process trains with from the `phase`-step checkpoint of `preset`: one step's loss and
    gradients on the calibration batch, under `threads` torch threads (1: as the quality grid's workers train).
    Branches are paired only when trained under one digest: another CPU's kernels (vector width, BLAS blocking) move
    every branch, and a checkpoint trained on another CPU lands elsewhere (tiny's bf16 branches: 5e-5 nats apart from
    the 100-step checkpoints of two x86 machines, 0.004 from the 400- and 1200-step ones), which the same batches no
    longer cancel."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model, _, _ = model_at(checkpoint(phase, preset))
        loss = model.loss(calibration_batch())
        loss.backward()
    finally:
        torch.set_num_threads(before)
    digest = hashlib.sha256()
    for t in (loss.detach(), *(p.grad for p in model.parameters())):
        digest.update(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def check_paired(runs: dict[str, dict], what: str) -> None:
    """Fail unless the runs {key: result} that one paired comparison subtracts were trained under one `numerics`
    digest (a run recorded before the digest was kept counts as a digest of its own)."""
    by_digest = collections.defaultdict(list)
    for key, r in sorted(runs.items()):
        by_digest[r.get("numerics", "not recorded")].append(key)
    if len(by_digest) > 1:
        kinds = "; ".join(f"{d}: {len(keys)} ({keys[0]}, ...)" for d, keys in sorted(by_digest.items()))
        raise SystemExit(f"{what}: runs trained under different numerics (another machine or checkpoint) are not "
                         f"paired, and a paired comparison needs them all: {kinds}. Train them in a cache of their own "
                         "(SNIP_BENCH_CACHE)")


def check_trainable_beside(cached: dict[str, dict], preset: str, phase: int, seed: int) -> None:
    """Before training runs from `preset`'s `phase`-step checkpoint on `seed`'s batches: the cached runs {key: result}
    they will be paired with were trained under this process's numerics."""
    check_paired({**cached, "(this machine's runs to train)": {"numerics": numerics(phase, preset)}},
                 f"{preset}, checkpoint {phase}, seed {seed}")


def check_cache_numerics(done: dict, path: Path, phase: int, preset: str = "tiny") -> None:
    """Before a run from `preset`'s `phase`-step checkpoint is trained into `done` (the cache read from `path`), whose
    results the study subtracts from each other: the runs it holds from that checkpoint were trained under this
    process's `numerics` (at its torch threads), which `done` records for the cache's next write. A cache that holds
    runs but no record was written before the record was kept: its runs' numerics are unknown, so none is trained
    beside them."""
    if done and CACHE_NUMERICS not in done:
        raise SystemExit(f"{path}: its runs carry no record of the numerics they were trained under (cached before the "
                         "record was kept), and a paired difference needs them all trained under one. Train them in a "
                         "cache of their own (SNIP_BENCH_CACHE)")
    checkpoint_key, mine = f"{preset}/{phase}", numerics(phase, preset, torch.get_num_threads())
    recorded = done.setdefault(CACHE_NUMERICS, {})
    if recorded.setdefault(checkpoint_key, mine) != mine:
        raise SystemExit(f"{path}: its runs from {preset}'s {phase}-step checkpoint were trained under numerics "
                         f"{recorded[checkpoint_key]}, this process trains under {mine} (another machine, checkpoint or "
                         "thread count), and runs of two are not paired. Train them in a cache of their own "
                         "(SNIP_BENCH_CACHE)")
