"""The training loop: ``train(TrainConfig(...)) -> summary dict``.

A run can stop early and hand back its state, and another run can start from such a state
(``snip_train.state.TrainState``): ``train(cfg, stop_at=W)["state"]`` and ``train(cfg, start=state)``.
``cfg.steps`` is always the length of the whole run: the learning-rate schedule and the evaluation
steps are defined over it, so a run started from the state of step W is, bit for bit, the rest of the
uninterrupted run of the same config. Evaluation leaves no trace on the training run (it does not
advance the layers' stochastic-rounding counters), so the training trajectory does not depend on when,
or how often, the run is evaluated.

Checkpoints (``snip_train.checkpoint``): with ``checkpoint_interval=N`` and an ``out_dir`` the run
writes ``out_dir/checkpoint.pt`` every N steps (atomically; the previous one stays until the new one is
whole), and ``train(cfg, resume=load_checkpoint(out_dir))`` continues it after a crash: the same
config (anything else is refused), its history so far, no extra evaluation at the resume step, so the
loss history, the evaluations and the final weights are bit for bit those of the uninterrupted run.

Precision is chosen by ``TrainConfig.precision``:

* ``"bf16"``        -- plain ``nn.Linear`` (bf16 autocast on GPU, float32 on CPU);
* a plan preset     -- ``"fp8"`` (every converted linear in FP8) or ``"fp4_mlp"``
                       (``{"*.mlp.*": "fp4", "*": "fp8"}``), see ``PLAN_PRESETS``;
* any other string  -- a precision name applied to every converted linear (``"fp4"``, ``"mxfp8"``...);
* ``path/to/plan.json`` -- a JSON object ``{FQN or glob: precision}`` (or ``{"plan": {...}}``);
* a dict            -- ``{FQN or glob: precision}`` passed straight to ``snip_ops.convert``.

Non-bf16 plans go through ``snip_ops.convert(model, plan=...)``, which swaps ``nn.Linear``
modules for ``snip_ops.SnipLinear`` (embedding and ``lm_head`` stay high precision by default).
``snip_ops`` is imported lazily, only when such a plan is used.

Hook points (for the planner):

* ``prepare_model(model) -> model``  after the model is built, moved to the device and converted;
* ``on_setup(model, optimizer)``      once, after the optimizer exists;
* ``on_step(step, model, batch)``     before every training step (0-based ``step``; ``batch`` is the
                                      int64 [B, T+1] window tensor on the device). Precision changes
                                      made here apply to that step.
* ``on_loss(step, loss)``             after every training step, with its training loss (a float).
* ``hooks_state() -> state``          the hooks' own state, stored in every checkpoint (the planner's:
                                      ``planning.PlannerHooks``, which a resumed run restores itself).

``check_config(cfg)`` raises ``UsageError`` (``snip_train.errors``) for what can be checked before
anything is loaded or trained: counts, the parameter storage, the device, the corpus path, and the
precision -- an unknown name, an unreadable or malformed plan file, a plan entry that matches no layer.
``train`` calls it first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import random
import re
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from .checkpoint import CHECKPOINT_FILE, Checkpoint, differences, save_checkpoint
from .data import DEFAULT_MAX_BYTES, TokenData
from .errors import UsageError, user_input
from .model import Llama, LlamaConfig
from .state import TrainState, capture, restore, set_sr_counters, sr_counters

__all__ = ["TrainConfig", "train", "check_config", "PLAN_PRESETS", "resolve_plan", "apply_precision",
           "linear_precisions", "resolve_device", "lr_at", "learning_rates", "json_safe", "jsonable", "config_json",
           "RUN_ONLY_FIELDS"]

PLAN_PRESETS: dict[str, Any] = {
    "bf16": None,
    "fp8": "fp8",
    "fp4_mlp": {"*.mlp.*": "fp4", "*": "fp8"},
}


WEIGHT_MODES = ("fp32", "bf16_sr", "bf16_nearest")


@dataclass
class TrainConfig:
    # model
    preset: str = "tiny"
    model: LlamaConfig | None = None  # overrides `preset` when given
    # optimisation
    steps: int = 300
    batch_size: int = 8
    seq_len: int | None = None  # None: the model's max_seq_len
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int | None = None  # None: 10% of steps, at most 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    adam_eps: float = 1e-8
    grad_clip: float | None = 1.0
    # parameter storage and optimizer (WEIGHT_MODES): "fp32" parameters with torch.optim.AdamW, or
    # "bf16_sr" / "bf16_nearest" BF16 parameters with snip_ops.optim.AdamW writing back with
    # stochastic rounding / round-to-nearest (no FP32 master copy)
    weights: str = "fp32"
    # precision
    precision: str | dict | None = "bf16"
    # what the summary and the loss plot call the precision when a hook chooses it as the run goes ("snip": a
    # live planner); `precision` is then only where the run starts
    precision_name: str | None = None
    amp: bool | None = None  # bf16 autocast; None: on for CUDA or BF16 weights, off (float32) otherwise
    # data
    corpus: str | None = None  # None: the Python stdlib sources
    max_bytes: int | None = DEFAULT_MAX_BYTES
    token_dtype: str | None = None  # for raw .bin token files (default uint16)
    val_fraction: float = 0.05
    # evaluation / logging
    eval_interval: int = 50  # 0: only at the start and the end
    eval_batches: int = 4
    # runtime
    seed: int = 0
    device: str = "auto"
    deterministic: bool = False  # torch.use_deterministic_algorithms (mostly matters on GPU)
    out_dir: str | None = None  # where summary.json / loss.png go; None: write nothing
    save_checkpoint: bool = False  # model.pt (the final weights) in out_dir
    checkpoint_interval: int = 0  # out_dir/checkpoint.pt every N steps, to resume from (0: none)
    progress: bool = True
    verbose: bool = False
    name: str | None = None
    # hooks
    prepare_model: Callable[[nn.Module], nn.Module] | None = field(default=None, repr=False)
    on_setup: Callable[[nn.Module, torch.optim.Optimizer], None] | None = field(default=None, repr=False)
    on_step: Callable[[int, nn.Module, torch.Tensor], Any] | None = field(default=None, repr=False)
    on_loss: Callable[[int, float], Any] | None = field(default=None, repr=False)
    hooks_state: Callable[[], Any] | None = field(default=None, repr=False)
    # the `snip train` flags that started the run, kept in its checkpoints for `snip train --resume DIR`
    command: Mapping[str, Any] | None = field(default=None, repr=False)


# What a run writes and shows, not what it computes: a resumed run may change these.
RUN_ONLY_FIELDS = ("out_dir", "name", "precision_name", "save_checkpoint", "checkpoint_interval", "progress",
                   "verbose", "prepare_model", "on_setup", "on_step", "on_loss", "hooks_state", "command")
# What a resumed run may change beside them: its length (the learning-rate schedule then spans the new one).
RESUME_MAY_CHANGE = ("steps",)


# ---------------------------------------------------------------------------------------
# precision plans
# ---------------------------------------------------------------------------------------
def resolve_plan(precision: Any) -> Any:
    """Turn the ``precision`` option into the ``plan`` argument of ``snip_ops.convert``.

    Returns ``None`` for plain high precision (no conversion).
    """
    if precision is None:
        return None
    if isinstance(precision, dict):
        return dict(precision)
    if isinstance(precision, str):
        if precision in PLAN_PRESETS:
            p = PLAN_PRESETS[precision]
            return dict(p) if isinstance(p, dict) else p
        if precision.endswith(".json"):
            return _read_plan_file(precision)
    return precision  # a precision name ("fp4", "mxfp8", ...) or a LinearPrecision


def _read_plan_file(path: str) -> dict:
    try:
        with open(path) as f:
            obj = json.load(f)
    except OSError as e:
        raise UsageError(f"cannot read plan file {path}: {e.strerror or e}") from e
    except ValueError as e:  # json.JSONDecodeError (with line and column), UnicodeDecodeError
        raise UsageError(f"plan file {path} is not valid JSON: {e}") from e
    if isinstance(obj, dict) and isinstance(obj.get("plan"), dict):
        obj = obj["plan"]
    if not isinstance(obj, dict):
        raise UsageError(f"plan file {path}: expected a JSON object {{layer or glob: precision}} (or a plan "
                         f"with a \"plan\" object), got a JSON {type(obj).__name__}")
    return obj


def apply_precision(model: nn.Module, precision: Any) -> nn.Module:
    """Apply a precision option (see ``resolve_plan``) to ``model`` via ``snip_ops.convert``."""
    plan = resolve_plan(precision)
    if plan is None:
        return model
    import snip_ops  # lazy: only needed for low-precision plans

    return snip_ops.convert(model, plan=plan)


def jsonable(x: Any) -> Any:
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if callable(getattr(x, "to_json", None)):  # snip_ops.LinearPrecision
        return jsonable(x.to_json())
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if hasattr(x, "name") and isinstance(getattr(x, "name"), str):  # enums, format objects
        return x.name
    if callable(x):
        return getattr(x, "__qualname__", None) or type(x).__name__
    return str(x)


def linear_precisions(model: nn.Module) -> dict[str, Any]:
    """``{FQN: precision}`` for every linear layer: ``"bf16"`` for plain ``nn.Linear``,
    the module's ``precision`` attribute (JSON-ified) for converted ones."""
    out = {}
    for name, m in model.named_modules():
        prec = getattr(m, "precision", None)
        if prec is not None and not isinstance(m, nn.Embedding):
            out[name] = jsonable(prec)
        elif isinstance(m, nn.Linear):
            out[name] = "bf16"
    return out


def _precision_counts(precs: dict[str, Any]) -> dict[str, int]:
    return dict(Counter(json.dumps(v) if not isinstance(v, str) else v for v in precs.values()))


# ---------------------------------------------------------------------------------------
# checking a configuration before it runs
# ---------------------------------------------------------------------------------------
def _layer_patterns(model: nn.Module) -> str:
    """The model's linear layers, block indices folded: 'model.layers.N.self_attn.q_proj, ..., lm_head'."""
    names = (re.sub(r"\.\d+\.", ".N.", n) for n, m in model.named_modules() if isinstance(m, nn.Linear))
    return ", ".join(dict.fromkeys(names))


def _check_precision(precision: Any, mcfg: LlamaConfig) -> None:
    plan = resolve_plan(precision)  # a plan file that cannot be read or parsed raises here
    if plan is None:
        return
    import snip_ops

    with torch.device("meta"):  # the layer names, without the memory or the time of a real model
        model = Llama(mcfg)
    try:
        snip_ops.convert(model, plan=plan)
    except (ValueError, TypeError) as e:
        if isinstance(precision, str) and precision.endswith(".json"):
            raise UsageError(f"plan file {precision}: {e} (its layers: {_layer_patterns(model)}; globs such as "
                             f"'*.mlp.*' match several)") from e
        if isinstance(precision, str):
            raise UsageError(f"precision {precision!r}: {e}; or a plan preset ({', '.join(PLAN_PRESETS)}) or a plan "
                             f".json file") from e
        raise UsageError(f"precision plan: {e}") from e


def check_config(cfg: TrainConfig) -> None:
    """Raise `UsageError` for a configuration that cannot run (see the module docstring); cheap: it
    loads no data and builds the model on the meta device only."""
    for name in ("steps", "batch_size"):
        if getattr(cfg, name) < 1:
            raise UsageError(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.seq_len is not None and cfg.seq_len < 1:
        raise UsageError(f"seq_len must be >= 1, got {cfg.seq_len}")
    for name in ("eval_interval", "eval_batches", "checkpoint_interval"):
        if getattr(cfg, name) < 0:
            raise UsageError(f"{name} must be >= 0, got {getattr(cfg, name)}")
    if cfg.checkpoint_interval and not cfg.out_dir:
        raise UsageError("checkpoints need an output directory (out_dir) to go to")
    if cfg.weights not in WEIGHT_MODES:
        raise UsageError(f"weights must be one of {WEIGHT_MODES}, got {cfg.weights!r}")
    resolve_device(cfg.device)
    if cfg.corpus is not None and not Path(cfg.corpus).exists():
        raise UsageError(f"corpus not found: {cfg.corpus} (a text file, a directory of them, or a .npy / .bin "
                         "token file)")
    if cfg.model is None:
        with user_input():
            mcfg = LlamaConfig.preset(cfg.preset)
    else:
        mcfg = cfg.model
    _check_precision(cfg.precision, mcfg)


# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------
def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise UsageError(f"not a device: {device!r} (auto, cpu, cuda or cuda:N)") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError("device 'cuda' requested but CUDA is not available (use 'cpu' or 'auto')")
    return dev


def warmup_steps(cfg: TrainConfig) -> int:
    return cfg.warmup_steps if cfg.warmup_steps is not None else max(1, min(100, cfg.steps // 10))


def saved_warmup_steps(config: Mapping[str, Any]) -> int:
    """`warmup_steps` of a run from its config as JSON (a checkpoint's)."""
    return warmup_steps(TrainConfig(steps=config.get("steps", 0), warmup_steps=config.get("warmup_steps")))


def learning_rates(cfg: TrainConfig) -> Callable[[int], float]:
    """step -> the loop's learning rate at that step (`lr_at`), and 0 from ``cfg.steps`` on, where the run takes
    no more steps: the schedule the planner's WD horizon looks ahead along (SnipPlanner's lr_schedule)."""
    return functools.partial(_scheduled_lr, cfg=cfg, warmup=warmup_steps(cfg))


def _scheduled_lr(step: int, cfg: TrainConfig, warmup: int) -> float:
    return lr_at(step, cfg, warmup) if step < cfg.steps else 0.0


def lr_at(step: int, cfg: TrainConfig, warmup: int) -> float:
    """Linear warmup to ``lr`` then cosine decay to ``lr * min_lr_ratio`` at the last step."""
    if warmup > 0 and step < warmup:
        return cfg.lr * (step + 1) / warmup
    span = max(1, cfg.steps - 1 - warmup)
    t = min(1.0, (step - warmup) / span)
    min_lr = cfg.lr * cfg.min_lr_ratio
    return min_lr + 0.5 * (cfg.lr - min_lr) * (1.0 + math.cos(math.pi * t))


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def config_json(cfg: TrainConfig) -> dict[str, Any]:
    return {f.name: jsonable(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def _fmt_params(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


@torch.no_grad()
def _evaluate(model: nn.Module, batches: list[torch.Tensor], autocast) -> float:
    """Mean validation loss. The SR counters are put back afterwards: a low-precision forward advances
    them, and the training steps must draw the same rounding bits however often the run is evaluated."""
    was_training = model.training
    counters = sr_counters(model)
    model.eval()
    total = 0.0
    for b in batches:
        with autocast():
            total += float(model.loss(b))
    model.train(was_training)
    set_sr_counters(model, counters)
    return total / max(1, len(batches))


# ---------------------------------------------------------------------------------------
# the loop
# ---------------------------------------------------------------------------------------
def train(cfg: TrainConfig, *, start: TrainState | None = None, stop_at: int | None = None,
          resume: Checkpoint | None = None) -> dict[str, Any]:
    """Train a model as configured; returns (and, with ``out_dir``, writes) the summary.

    ``start``: continue from this state (steps ``start.step`` .. ``cfg.steps - 1``) instead of step 0.
    ``stop_at``: stop before step ``stop_at`` and return the state there as ``summary["state"]``
    (a ``TrainState``; it is not written to summary.json).
    ``resume``: a checkpoint of this run (same config, same kind of hooks): continue it as if it had not
    stopped (its state, its history; see the module docstring). Not together with ``start``.
    """
    check_config(cfg)
    if resume is not None:
        if start is not None:
            raise ValueError("give start (a branch) or resume (a checkpoint of this run), not both")
        _check_resume(cfg, resume)
        start = resume.state
    stop = cfg.steps if stop_at is None else stop_at
    if not 0 <= (start.step if start is not None else 0) <= stop <= cfg.steps:
        raise ValueError(f"a run of {cfg.steps} steps cannot go from step {start.step if start else 0} to step "
                         f"{stop}")
    t_setup = time.perf_counter()
    log = (lambda *a: print(*a, flush=True)) if cfg.verbose else (lambda *a: None)
    device = resolve_device(cfg.device)
    if cfg.deterministic and not torch.are_deterministic_algorithms_enabled():
        if device.type == "cuda":
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            return _train(cfg, device, t_setup, log, start, stop, stop_at is not None, resume)
        finally:
            torch.use_deterministic_algorithms(False)
    return _train(cfg, device, t_setup, log, start, stop, stop_at is not None, resume)


def _check_resume(cfg: TrainConfig, ckpt: Checkpoint) -> None:
    """`UsageError` unless `ckpt` is a checkpoint of the run `cfg` describes."""
    # The warmup as the runs use it: a default one follows the steps, which a resumed run may change.
    saved = {**ckpt.config, "warmup_steps": saved_warmup_steps(ckpt.config)}
    current = {**config_json(cfg), "warmup_steps": warmup_steps(cfg)}
    diffs = differences(saved, current, RUN_ONLY_FIELDS + RESUME_MAY_CHANGE)
    if diffs:
        hint = "" if "command" in ckpt.config else " (the checkpoint predates recorded commands: give the run's flags)"
        raise UsageError(f"the checkpoint belongs to another run: {'; '.join(diffs)}{hint}")
    if cfg.steps <= ckpt.state.step:
        raise UsageError(f"the checkpoint is at step {ckpt.state.step}: a resumed run needs more steps than that "
                         f"(got {cfg.steps})")
    if (ckpt.hooks is None) != (cfg.hooks_state is None):
        had = "with" if ckpt.hooks is not None else "without"
        raise UsageError(f"the checkpoint was written by a run {had} training-loop hooks (a live planner); resume "
                         f"it {had} them")
    trained = ckpt.history["train"]["step"]
    if len(trained) != ckpt.state.step - ckpt.start_step or not ckpt.start_step < ckpt.state.step < cfg.steps:
        raise UsageError(f"the checkpoint is inconsistent: {len(trained)} steps of history for a state at step "
                         f"{ckpt.state.step} of a run of {cfg.steps} steps from step {ckpt.start_step}")


@dataclass(frozen=True)
class _Run:
    """What one call of `train` trains with, built once by `_setup_run`: the data, the model and its optimizer in
    the state the run starts from, the fixed evaluation batches and where the outputs go."""

    cfg: TrainConfig
    device: torch.device
    data: TokenData
    model_config: LlamaConfig
    seq_len: int
    model: nn.Module
    n_params: int
    plan: Any                          # resolve_plan(cfg.precision)
    precisions: dict[str, Any]         # linear_precisions(model) at the start
    optimizer: torch.optim.Optimizer
    params: list[nn.Parameter]         # the trained ones (gradient clipping, the gradient norm)
    train_gen: torch.Generator         # the training-batch order
    use_amp: bool
    eval_data: list[torch.Tensor]
    out_dir: Path | None
    first: int                         # this call trains steps first .. stop - 1
    run_start: int                     # the step the whole run began at (before any resume)
    resumed_at: tuple[int, ...]

    @property
    def tokens_per_step(self) -> int:
        return self.cfg.batch_size * self.seq_len

    def autocast(self):
        if self.use_amp:
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()


@dataclass(frozen=True)
class _History:
    """The run's loss curves so far (a resumed run's start with its checkpoint's), appended to in place."""

    train_step: list[int]
    train_loss: list[float]
    lr: list[float]
    grad_norm: list[float]
    val_step: list[int]
    val_loss: list[float]
    steps_before: int  # training steps in the history before this call (a resumed run's)

    @classmethod
    def of(cls, resume: Checkpoint | None) -> "_History":
        past = resume.history if resume is not None else {"train": {k: [] for k in ("step", "loss", "lr", "grad_norm")},
                                                           "val": {"step": [], "loss": []}}
        train, val = past["train"], past["val"]
        return cls(list(train["step"]), list(train["loss"]), list(train["lr"]), list(train["grad_norm"]),
                   list(val["step"]), list(val["loss"]), len(train["loss"]))

    def as_dict(self) -> dict[str, dict[str, list]]:
        return {"train": {"step": self.train_step, "loss": self.train_loss, "lr": self.lr, "grad_norm": self.grad_norm},
                "val": {"step": self.val_step, "loss": self.val_loss}}


@dataclass(frozen=True)
class _Outcome:
    diverged: bool
    eval_s: float
    checkpoint_s: float
    total_s: float


def _model_config(cfg: TrainConfig, data: TokenData) -> tuple[LlamaConfig, int]:
    """The model's configuration, grown to the data's vocabulary and the sequence length, and that length."""
    mcfg = cfg.model if cfg.model is not None else LlamaConfig.preset(cfg.preset)
    if data.vocab_size > mcfg.vocab_size:
        mcfg = dataclasses.replace(mcfg, vocab_size=data.vocab_size)
    seq_len = cfg.seq_len or mcfg.max_seq_len
    if seq_len > mcfg.max_seq_len:
        mcfg = dataclasses.replace(mcfg, max_seq_len=seq_len)
    return mcfg, seq_len


def _make_optimizer(cfg: TrainConfig, model: nn.Module, device: torch.device
                    ) -> tuple[torch.optim.Optimizer, list[nn.Parameter]]:
    """AdamW decaying the matrices (embeddings included), not norms or biases; and the trained parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt_kw: dict[str, Any] = dict(lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.adam_eps)
    if device.type == "cuda":
        opt_kw["fused"] = True
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if cfg.weights == "fp32":
        return torch.optim.AdamW(groups, **opt_kw), params
    from snip_ops.optim import AdamW as SnipAdamW

    opt_kw.pop("fused", None)
    return SnipAdamW(groups, bf16_sr=cfg.weights == "bf16_sr", seed=cfg.seed, **opt_kw), params


def _setup_run(cfg: TrainConfig, device: torch.device, start: TrainState | None, resume: Checkpoint | None) -> _Run:
    """Seeds, data, model (built on the CPU under the seed, so init is identical on every device), optimizer, the
    state to start from and the hooks' setup, in that order."""
    _seed_everything(cfg.seed)
    with user_input():  # a corpus that cannot be read is the user's error
        data = TokenData.from_path(cfg.corpus, max_bytes=cfg.max_bytes, token_dtype=cfg.token_dtype,
                                   val_fraction=cfg.val_fraction)
    mcfg, seq_len = _model_config(cfg, data)
    model: nn.Module = Llama(mcfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    model = apply_precision(model, cfg.precision)
    if cfg.prepare_model is not None:
        model = cfg.prepare_model(model) or model
    model = model.to(device, torch.float32 if cfg.weights == "fp32" else torch.bfloat16)
    model.train()
    plan = resolve_plan(cfg.precision)
    precs = linear_precisions(model)
    optimizer, params = _make_optimizer(cfg, model, device)
    train_gen = torch.Generator().manual_seed(cfg.seed)
    if start is not None:
        restore(start, model, optimizer, train_gen)
    if cfg.on_setup is not None:
        cfg.on_setup(model, optimizer)
    if start is not None:  # after on_setup: a hook may have made more layers low-precision
        set_sr_counters(model, start.sr_counters)
    first = start.step if start is not None else 0
    use_amp = (device.type == "cuda" or cfg.weights != "fp32") if cfg.amp is None else bool(cfg.amp)
    eval_gen = torch.Generator().manual_seed(0x5EED)  # the same validation windows for every run
    eval_data = [data.get_batch("val", cfg.batch_size, seq_len, eval_gen).to(device) for _ in range(cfg.eval_batches)]
    out_dir = Path(cfg.out_dir) if cfg.out_dir else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    return _Run(cfg, device, data, mcfg, seq_len, model, n_params, plan, precs, optimizer, params, train_gen, use_amp,
                eval_data, out_dir, first, resume.start_step if resume is not None else first,
                (*resume.resumed_at, first) if resume is not None else ())


def _log_start(run: _Run, stop: int, log) -> None:
    cfg, mcfg, data = run.cfg, run.model_config, run.data
    name = "custom" if cfg.model is not None else cfg.preset
    log(f"snip train | model {name}: {_fmt_params(run.n_params)} params (dim {mcfg.dim}, {mcfg.n_layers} layers, "
        f"{mcfg.n_heads} heads / {mcfg.n_kv_heads} kv, ffn {mcfg.ffn_hidden}) | device {run.device} "
        f"({'bf16 autocast' if run.use_amp else 'float32'})")
    log(f"data: {data.name}, {len(data) / 1e6:.2f}M tokens ({data.num_tokens('train') / 1e6:.2f}M train / "
        f"{data.num_tokens('val') / 1e6:.2f}M val) | batch {cfg.batch_size} x {run.seq_len} = {run.tokens_per_step} "
        f"tokens/step | {cfg.steps} steps, lr {cfg.lr:g}, warmup {warmup_steps(cfg)}, seed {cfg.seed}"
        + (f" | steps {run.first}..{stop - 1} of them" if (run.first, stop) != (0, cfg.steps) else ""))
    plan_desc = "none (plain nn.Linear)" if run.plan is None else json.dumps(jsonable(run.plan))
    log(f"precision: {cfg.precision if isinstance(cfg.precision, str) else 'custom'} -> plan {plan_desc} | "
        f"linears: " + ", ".join(f"{k} x{v}" for k, v in _precision_counts(run.precisions).items()))
    if run.out_dir is not None:
        log(f"output: {run.out_dir}")


def _train_step(run: _Run, step: int, lr: float) -> tuple[float, float]:
    """One optimizer step at learning rate `lr` (the hooks' on_step before it, on_loss after it): (its training
    loss, the gradient norm before clipping)."""
    cfg = run.cfg
    for g in run.optimizer.param_groups:
        g["lr"] = lr
    batch = run.data.get_batch("train", cfg.batch_size, run.seq_len, run.train_gen).to(run.device, non_blocking=True)
    if cfg.on_step is not None:
        cfg.on_step(step, run.model, batch)
    with run.autocast():
        loss = run.model.loss(batch)
    loss.backward()
    if cfg.grad_clip:
        gnorm = float(torch.nn.utils.clip_grad_norm_(run.params, cfg.grad_clip))
    else:
        gnorm = float(torch.linalg.vector_norm(
            torch.stack([p.grad.detach().norm() for p in run.params if p.grad is not None])))
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    lv = float(loss.detach())
    if cfg.on_loss is not None:
        cfg.on_loss(step, lv)
    return lv, gnorm


def _run_eval(run: _Run, history: _History, step: int) -> float:
    """The validation loss before `step`, recorded in the history (NaN, unrecorded, without evaluation batches)."""
    if run.cfg.eval_batches <= 0:
        return float("nan")
    v = _evaluate(run.model, run.eval_data, run.autocast)
    history.val_step.append(step)
    history.val_loss.append(v)
    return v


def _write_checkpoint(run: _Run, history: _History, step: int) -> None:
    """The run before `step`, to resume from (after that step's evaluation, which it records)."""
    cfg = run.cfg
    save_checkpoint(run.out_dir / CHECKPOINT_FILE, Checkpoint(
        capture(step, run.model, run.optimizer, run.train_gen), config_json(cfg), history.as_dict(),
        cfg.hooks_state() if cfg.hooks_state is not None else None, run.run_start, run.resumed_at))


def _loop(run: _Run, history: _History, stop: int, resumed: bool, log) -> _Outcome:
    """Steps run.first .. stop - 1 with their evaluations and checkpoints; stops early at a non-finite loss."""
    from tqdm.auto import tqdm

    cfg = run.cfg
    warmup = warmup_steps(cfg)
    t0 = time.perf_counter()
    eval_s = checkpoint_s = 0.0
    if not resumed:
        te = time.perf_counter()
        last_val = _run_eval(run, history, run.first)
        eval_s += time.perf_counter() - te
    else:  # the evaluations so far are in the history (that of the resume step too, if it is an evaluation step)
        last_val = history.val_loss[-1] if history.val_loss else float("nan")
        log(f"resumed at step {run.first} of the run")
    diverged = False
    pbar = tqdm(range(run.first, stop), desc="train", disable=not cfg.progress, dynamic_ncols=True, mininterval=0.5)
    for step in pbar:
        lr = lr_at(step, cfg, warmup)
        lv, gnorm = _train_step(run, step, lr)
        history.train_step.append(step + 1)
        history.train_loss.append(lv)
        history.lr.append(lr)
        history.grad_norm.append(gnorm)
        if not math.isfinite(lv):
            diverged = True
            pbar.set_postfix_str(f"loss={lv} (diverged)")
            break
        is_last = step + 1 == stop
        if is_last or (cfg.eval_interval and (step + 1) % cfg.eval_interval == 0):
            te = time.perf_counter()
            last_val = _run_eval(run, history, step + 1)
            eval_s += time.perf_counter() - te
        if cfg.checkpoint_interval and (step + 1) % cfg.checkpoint_interval == 0 and not is_last:
            tc = time.perf_counter()
            _write_checkpoint(run, history, step + 1)
            checkpoint_s += time.perf_counter() - tc
        pbar.set_postfix_str(f"loss={lv:.3f} val={last_val:.3f} lr={lr:.2e}", refresh=False)
    pbar.close()
    if run.device.type == "cuda":
        torch.cuda.synchronize(run.device)
    return _Outcome(diverged, eval_s, checkpoint_s, time.perf_counter() - t0)


def _summary(run: _Run, history: _History, outcome: _Outcome, setup_s: float) -> dict[str, Any]:
    cfg = run.cfg
    train_s = max(1e-9, outcome.total_s - outcome.eval_s - outcome.checkpoint_s)
    steps_done = len(history.train_loss)  # of the whole run, resumed or not
    steps_here = steps_done - history.steps_before
    tail = [v for v in history.train_loss[-10:] if math.isfinite(v)]
    val_loss = history.val_loss
    return {
        "name": cfg.name,
        "config": config_json(cfg),
        "model_config": dataclasses.asdict(run.model_config),
        "n_params": run.n_params,
        "device": str(run.device),
        "compute_dtype": "bfloat16 (autocast)" if run.use_amp else "float32",
        "torch_threads": torch.get_num_threads(),
        "data": {"name": run.data.name, "tokens": len(run.data), "train_tokens": run.data.num_tokens("train"),
                 "val_tokens": run.data.num_tokens("val"), "vocab_size": run.data.vocab_size},
        "precision": cfg.precision_name or jsonable(cfg.precision),
        "initial_precision": jsonable(cfg.precision),
        "plan": jsonable(run.plan),
        "linear_precisions": run.precisions,  # at the start; a planner may change them during training
        "final_linear_precisions": linear_precisions(run.model),
        "precision_counts": _precision_counts(run.precisions),
        "start_step": run.run_start,
        "resumed_at": list(run.resumed_at),
        "steps": steps_done,
        "tokens_per_step": run.tokens_per_step,
        "tokens": steps_done * run.tokens_per_step,
        "initial_val_loss": val_loss[0] if val_loss else None,
        "final_train_loss": sum(tail) / len(tail) if tail else float("nan"),
        "last_train_loss": history.train_loss[-1] if history.train_loss else None,
        "final_val_loss": val_loss[-1] if val_loss else None,
        "diverged": outcome.diverged,
        "tokens_per_s": steps_here * run.tokens_per_step / train_s,  # the times are of this process's steps
        "step_time_s": train_s / max(1, steps_here),
        "train_time_s": train_s,
        "eval_time_s": outcome.eval_s,
        "checkpoint_time_s": outcome.checkpoint_s,
        "setup_time_s": setup_s,
        "time_s": outcome.total_s + setup_s,
        "history": history.as_dict(),
    }


def _write_outputs(run: _Run, summary: dict[str, Any], history: _History) -> None:
    """summary.json, loss.png and (with save_checkpoint) model.pt in the output directory."""
    cfg, out_dir = run.cfg, run.out_dir
    summary["out_dir"] = str(out_dir)
    with open(out_dir / "summary.json", "w") as f:
        json.dump(json_safe(summary), f, indent=2)
    from .plots import plot_losses

    name = "custom" if cfg.model is not None else cfg.preset
    precision = summary["precision"] if isinstance(summary["precision"], str) else "custom"
    title = f"{name} ({_fmt_params(run.n_params)}), precision {precision}, seed {cfg.seed}"
    plot_losses(out_dir / "loss.png", history.train_step, history.train_loss, history.val_step, history.val_loss,
                title=title)
    if cfg.save_checkpoint:
        torch.save({"model_config": dataclasses.asdict(run.model_config), "model": run.model.state_dict()},
                   out_dir / "model.pt")


def _train(cfg: TrainConfig, device: torch.device, t_setup: float, log, start: TrainState | None, stop: int,
           keep_state: bool, resume: Checkpoint | None) -> dict[str, Any]:
    run = _setup_run(cfg, device, start, resume)
    _log_start(run, stop, log)
    history = _History.of(resume)
    setup_s = time.perf_counter() - t_setup
    outcome = _loop(run, history, stop, resume is not None, log)
    summary = _summary(run, history, outcome, setup_s)
    if run.out_dir is not None:
        _write_outputs(run, summary, history)
    if keep_state and not outcome.diverged:
        summary["state"] = capture(stop, run.model, run.optimizer, run.train_gen)  # after summary.json: tensors
    return summary


def json_safe(x: Any) -> Any:
    """NaN / inf are not JSON; write them as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_safe(v) for v in x]
    return x
