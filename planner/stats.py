"""Statistics collection (docs/design.md §4.1): one high-precision forward/backward on a calibration batch.

`record(...)` installs temporary hooks on the planned linear layers, runs `loss_fn(model, batch)`
with every `SnipLinear` switched to bf16, and keeps per layer:

* a row sample of the GEMM operands x [rows, K] and dy [rows, N] (the same token rows for both, so
  that dy^T x on the sample is a wgrad on fewer tokens) -- bounded by `StatsConfig.memory_cap_bytes`;
* the RMS of the layer output y and of its gradient dy over the whole batch;
* the weight gradient dW (from `torch.autograd.grad`, so `.grad` of the parameters is never touched:
  the gradients of this pass are one parameter-sized copy, outside the operand cap);
* optionally (`sequence_grads`), sum_s ||dW_s||^2 over the batch's sequences s, dW_s = dy_s^T x_s the
  sequence's share of dW: what separates the gradient's signal from its noise (divergence.py,
  "Adam's signal share");

and, for the whole model, the Adam preconditioner of the next update (see `adam_preconditioner`).
All hooks are removed before returning; the RNG state of the caller is restored, so the training
step that follows is exactly what it would have been without the planner.

`LayerStats` / `PlannerStats` are the JSON-able numbers the ILP consumes (divergence.py fills them).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Iterator, Mapping, Sequence

import torch
from torch import nn

from snip_ops import SnipLinear
from snip_ops.formats import GEMMS
from snip_ops.reference import divide_by

from .cost import LayerShape

__all__ = [
    "StatsConfig", "LayerRecording", "Preconditioner", "LogitsGraph", "Recording", "record", "adam_preconditioner",
    "high_precision", "isolated_rng", "batch_rows", "first_rows", "gradient_variance", "gradient_noise_loss",
    "sequence_grad_sq", "LayerStats", "PlannerStats", "mean_stats",
]

LossFn = Callable[[nn.Module, object], torch.Tensor]
# The units of WD in statistics JSON: an excess training loss (divergence.py, "Weight divergence"). Statistics
# written before WD had units (no "wd_units") or in the relative-update units that loss units replaced ("update")
# cannot be priced by the ILP.
WD_UNITS = "loss"


@dataclass(frozen=True)
class StatsConfig:
    max_rows: int = 128                    # token rows sampled per layer (128: one full wgrad block)
    memory_cap_bytes: int = 256 * 2**20    # cap on all recorded operand samples together (float32)
    seed: int = 0                          # row sampling and the RNG of every measurement pass
    default_lr: float = 1e-3               # the learning rate the weight divergence assumes without an optimizer

    def __post_init__(self):
        if self.max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {self.max_rows}")
        if self.memory_cap_bytes <= 0:
            raise ValueError(f"memory_cap_bytes must be > 0, got {self.memory_cap_bytes}")
        if not self.default_lr > 0:
            raise ValueError(f"default_lr must be > 0, got {self.default_lr}")

    def rows_per_layer(self, layers: Mapping[str, nn.Linear]) -> int:
        """Rows sampled per layer: max_rows, reduced so that all x and dy samples fit the memory cap."""
        per_row = 4 * sum(m.in_features + m.out_features for m in layers.values())
        rows = min(self.max_rows, self.memory_cap_bytes // max(per_row, 1))
        if rows >= 128:
            rows -= rows % 128
        if rows < 16:
            need = 16 * per_row
            raise ValueError(f"memory_cap_bytes={self.memory_cap_bytes} leaves {rows} sampled rows per layer; "
                             f"at least 16 are needed ({need} bytes for these {len(layers)} layers)")
        return rows


@dataclass
class LayerRecording:
    """What one stats pass saw at one linear layer (tensors; transient)."""

    shape: LayerShape
    x: torch.Tensor            # [rows, K] float32 sample of the input
    rows: torch.Tensor         # the sampled row indices into the flattened [M, K] input
    dy: torch.Tensor           # [rows, N] float32 sample of the output gradient (same rows)
    weight: torch.Tensor       # [N, K] the weight (detached, not copied)
    out_rms: float             # RMS of y over the whole batch
    grad_out_rms: float        # RMS of dy over the whole batch
    weight_grad: torch.Tensor  # dW over the whole batch
    sequence_grad_sq: float | None = None  # sum_s ||dy_s^T x_s||^2 over the batch's sequences (record's sequence_grads)


@dataclass
class Preconditioner:
    """What the optimizer's next update makes of gradient noise: Adam's preconditioner D = 1 / (sqrt(v_hat) + eps).

    `excess_loss_weight[p]` is lr / (4 (sqrt(v_hat) + eps)) elementwise: gradient noise of variance
    s_i on parameter i raises the training loss, once the optimizer has settled with it, by
    sum_i excess_loss_weight_i s_i (divergence.py, "Weight divergence"). lr is the parameter group's
    current learning rate, or `default_lr` without an optimizer. With DivergenceConfig.wd_horizon,
    `divergence.measure` scales it down to the excess loss reached within that many steps.
    `second_moment_sum[p]` is sum(v_hat) over p's entries, the v_hat of that update (divergence.py, "Adam's
    signal share"). `source` says where v_hat came from.
    """

    source: str
    excess_loss_weight: dict[nn.Parameter, torch.Tensor] = field(default_factory=dict)
    second_moment_sum: dict[nn.Parameter, float] = field(default_factory=dict)


@dataclass
class LogitsGraph:
    """The statistics pass's forward kept for more backwards (divergence.py's Fisher draws): the logits of the
    model's call on record's `logits_of` and every planned layer's output, on the pass's autograd graph."""

    logits: torch.Tensor
    outputs: dict[str, torch.Tensor]


@dataclass
class Recording:
    loss: float
    layers: dict[str, LayerRecording]
    grads: dict[nn.Parameter, torch.Tensor]
    preconditioner: Preconditioner
    sequences: int | None = None  # the batch's sequences behind every layer's sequence_grad_sq (None: not measured)
    logits_graph: LogitsGraph | None = None  # record's logits_of; drop it when done (it holds the pass's graph)


@contextlib.contextmanager
def high_precision(modules: Mapping[str, nn.Module]) -> Iterator[None]:
    """Run every SnipLinear among `modules` in bf16 (no quantization), restoring the plan afterwards."""
    saved = {name: m.precision for name, m in modules.items() if isinstance(m, SnipLinear)}
    try:
        for name in saved:
            modules[name].set_precision("bf16")
        yield
    finally:
        for name, precision in saved.items():
            modules[name].set_precision(precision)


@contextlib.contextmanager
def isolated_rng(seed: int, device: torch.device) -> Iterator[None]:
    """A fixed RNG state inside (dropout masks agree between passes), the caller's state restored after."""
    devices = []
    if device.type == "cuda":
        devices = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _rms(t: torch.Tensor) -> float:
    return float(t.detach().float().pow(2).mean().sqrt()) if t.numel() else 0.0


def adam_preconditioner(optimizer: torch.optim.Optimizer | None,
                        grads: Mapping[nn.Parameter, torch.Tensor], default_lr: float = 1e-3) -> Preconditioner:
    """The preconditioner of the update the optimizer will take next with gradients `grads`.

    Reads Adam/AdamW state (`exp_avg_sq` or `max_exp_avg_sq`, `step`, the group's betas and eps).
    Parameters without that state (step 0, or an optimizer that is not Adam-like) use the gradient's own
    per-tensor second moment, v_hat = mean(g^2) held fixed; `source` says which. Without an optimizer the
    learning rate of `excess_loss_weight` is `default_lr`.
    """
    groups = {}
    if optimizer is not None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                groups[p] = group
    weight, second_moment, fallback = {}, {}, 0
    for p, g in grads.items():
        if optimizer is not None and p not in groups:
            continue  # not trained by this optimizer: its update cannot change
        group = groups.get(p, {})
        state = optimizer.state.get(p, {}) if optimizer is not None else {}
        g = g.detach().float()
        eps = float(group.get("eps", 1e-8))
        if "exp_avg_sq" in state and "betas" in group:
            b2 = group["betas"][1]
            t = float(state["step"]) + 1.0
            v = state.get("max_exp_avg_sq", state["exp_avg_sq"]).float()
            v_hat = divide_by(b2 * v + (1 - b2) * g * g, 1 - b2 ** t)
            denom = v_hat.sqrt() + eps
            second_moment[p] = float(v_hat.double().sum())
        else:
            fallback += 1
            denom = g.pow(2).mean().sqrt() + eps
            second_moment[p] = float(g.double().pow(2).sum())
        weight[p] = (float(group.get("lr", default_lr)) / 4 / denom).expand_as(g)
    if not weight:
        raise ValueError("no parameter of the optimizer received a gradient in the statistics pass")
    if fallback == 0:
        source = "adam state (exp_avg, exp_avg_sq)"
    elif fallback == len(weight):
        source = "gradient second moment per tensor (the optimizer has no Adam state yet)"
    else:
        source = f"adam state; {fallback} of {len(weight)} tensors without state use their gradient second moment"
    return Preconditioner(source, weight, second_moment)


def sequence_grad_sq(x: torch.Tensor, dy: torch.Tensor, memory_cap_bytes: int) -> float:
    """sum_s ||dy_s^T x_s||_F^2 over the leading dimension s of x [S, ..., K] and dy [S, ..., N] (float32 sums, the
    chunks added in float64; a float64 sum over the products would cost 3x the products themselves on a CPU):
    the squared norms of each sequence's share of a linear layer's weight gradient. For T rows per sequence,
    through the T x T Gram matrices, sum (x_s x_s^T) * (dy_s dy_s^T), when that is cheaper (T (K + N) < K N),
    else through the products dy_s^T x_s; sequences in chunks whose intermediates fit `memory_cap_bytes`."""
    if x.shape[0] != dy.shape[0] or x.shape[:-1] != dy.shape[:-1]:
        raise ValueError(f"x {tuple(x.shape)} and dy {tuple(dy.shape)} do not share their leading dimensions")
    s = x.shape[0]
    x, dy = x.reshape(s, -1, x.shape[-1]), dy.reshape(s, -1, dy.shape[-1])
    t, k, n = x.shape[1], x.shape[2], dy.shape[2]
    gram = t * (k + n) < k * n
    chunk = max(1, memory_cap_bytes // (4 * (2 * t * t if gram else k * n)))
    total = 0.0
    for i in range(0, s, chunk):
        xs, ds = x[i:i + chunk].float(), dy[i:i + chunk].float()
        if gram:
            total += float(((xs @ xs.transpose(1, 2)) * (ds @ ds.transpose(1, 2))).sum())
        else:
            total += float(torch.linalg.vector_norm(ds.transpose(1, 2) @ xs)) ** 2
    return total


def record(model: nn.Module, layers: Mapping[str, nn.Linear], batch, loss_fn: LossFn,
           optimizer: torch.optim.Optimizer | None, config: StatsConfig = StatsConfig(),
           sequence_grads: bool = False, logits_of: torch.Tensor | None = None) -> Recording:
    """One high-precision forward/backward on `batch` that records what the planner needs. With
    `sequence_grads`, also every layer's sequence_grad_sq when the batch's S >= 2 sequences (batch_rows) are
    the leading dimension of every planned layer's input [S, ..., K]; otherwise Recording.sequences is None.
    With `logits_of`, a model input (a causal LM's window inputs batch[:, :-1]): when `loss_fn` calls the model
    on exactly these values once and gets logits [*logits_of.shape, vocabulary] that need gradients, the pass
    keeps its graph and returns those logits with the layers' outputs as Recording.logits_graph, so that the
    caller can backpropagate more losses of the same forward (otherwise logits_graph is None)."""
    rows = config.rows_per_layer(layers)
    device = next(iter(layers.values())).weight.device
    recs: dict[str, LayerRecording] = {}
    outputs: dict[str, torch.Tensor] = {}
    logits_calls: list = []
    handles = []
    sequences = batch_rows(batch) if sequence_grads else None
    if sequences is not None and sequences < 2:
        sequences = None  # one sequence has no spread to measure

    def forward_hook(name: str):
        def hook(mod, args, out):
            if name in recs:
                raise RuntimeError(f"layer {name!r} ran twice in one forward; the planner needs one call per layer")
            nonlocal sequences
            full = args[0].detach()
            if sequences is not None and (full.dim() < 3 or full.shape[0] != sequences):
                sequences = None  # this layer's rows are not laid out by sequence
            per_sequence = full if sequences is not None else None  # held to the backward only when needed
            x = full.reshape(-1, mod.in_features)
            gen = torch.Generator().manual_seed(config.seed)
            idx = torch.randperm(x.shape[0], generator=gen)[:rows].sort().values.to(x.device)
            recs[name] = LayerRecording(
                LayerShape(name, mod.in_features, mod.out_features, x.shape[0]),
                x[idx].float().clone(), idx, torch.empty(0), mod.weight.detach(), _rms(out), 0.0, torch.empty(0))

            def grad_hook(g):
                dy = g.detach().reshape(-1, mod.out_features)
                recs[name].dy = dy[idx].float().clone()
                recs[name].grad_out_rms = _rms(dy)
                if sequences is not None:  # every layer's forward ran first: each kept its input
                    recs[name].sequence_grad_sq = sequence_grad_sq(per_sequence, g.detach(), config.memory_cap_bytes)

            if out.requires_grad:
                handles.append(out.register_hook(grad_hook))  # removed after this pass's backward
            if logits_of is not None:
                outputs[name] = out
        return hook

    def model_hook(mod, args, out):
        if args and torch.is_tensor(args[0]) and args[0].shape == logits_of.shape and torch.equal(args[0], logits_of):
            logits_calls.append(getattr(out, "logits", out))

    params = [p for p in model.parameters() if p.requires_grad]
    try:
        for name, module in layers.items():
            handles.append(module.register_forward_hook(forward_hook(name)))
        if logits_of is not None:
            handles.append(model.register_forward_hook(model_hook))
        with high_precision(layers), isolated_rng(config.seed, device):
            loss = loss_fn(model, batch)
            logits = logits_calls[0] if len(logits_calls) == 1 else None
            if not (torch.is_tensor(logits) and logits.requires_grad and logits.dim() == logits_of.dim() + 1
                    and logits.shape[:-1] == logits_of.shape):
                logits = None
            grads = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=logits is not None)
    finally:
        for h in handles:
            h.remove()
    missing = [n for n in layers if n not in recs or recs[n].dy.numel() == 0]
    if missing:
        raise RuntimeError(f"layers {missing[:5]} took no part in the loss of the calibration batch")
    grad_of = {p: g for p, g in zip(params, grads) if g is not None}
    for name, rec in recs.items():
        rec.weight_grad = grad_of[layers[name].weight].detach().float()
    loss = float(loss.detach())
    if not math.isfinite(loss):
        raise FloatingPointError(f"the calibration loss is {loss}; cannot plan from a non-finite loss")
    return Recording(loss, recs, grad_of, adam_preconditioner(optimizer, grad_of, config.default_lr), sequences,
                     LogitsGraph(logits, outputs) if logits is not None else None)


def batch_rows(batch) -> int | None:
    """The leading size shared by every tensor of a batch (a tensor, or tuples / lists / dicts of them and of
    non-tensors), or None if they disagree or there is no tensor with a leading dimension."""
    if torch.is_tensor(batch):
        return batch.shape[0] if batch.dim() > 0 else None
    parts = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (tuple, list)) else ()
    sizes = {n for n in map(batch_rows, parts) if n is not None}
    return sizes.pop() if len(sizes) == 1 else None


def first_rows(batch, n: int):
    """`batch` with every tensor cut to its first `n` rows (the structure of batch_rows)."""
    if torch.is_tensor(batch):
        return batch[:n] if batch.dim() > 0 else batch
    if isinstance(batch, Mapping):
        return {k: first_rows(v, n) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(first_rows(v, n) for v in batch)
    return batch


def gradient_variance(model: nn.Module, layers: Mapping[str, nn.Linear], batch, loss_fn: LossFn,
                      rec: Recording, seed: int) -> dict[nn.Parameter, torch.Tensor]:
    """{parameter: Var(g)} elementwise for every parameter of `rec.grads`, g the batch-mean gradient, from one
    forward/backward of the first half batch a (high precision; `batch` as in batch_rows): with b the rest,
    g - g_a = n_b (g_b - g_a) / n and Var(g_b - g_a) = Var(g) n (1/n_a + 1/n_b), so E (g_a - g)^2 n_a / n_b
    = Var(g) for any split."""
    rows = batch_rows(batch)
    if rows is None or rows < 2:
        raise ValueError("the gradient variance splits the batch in halves: it needs >= 2 rows in every tensor of "
                         "the batch (a tensor, or tuples / lists / dicts of them)")
    n_a = rows // 2
    params = list(rec.grads)
    device = next(iter(layers.values())).weight.device
    with high_precision(layers), isolated_rng(seed, device):
        grads = torch.autograd.grad(loss_fn(model, first_rows(batch, n_a)), params, allow_unused=True)
    return {p: (g.detach().float() - rec.grads[p].float()).pow(2) * (n_a / (rows - n_a))
            for p, g in zip(params, grads) if g is not None}


def gradient_noise_loss(variance: Mapping[nn.Parameter, torch.Tensor], rec: Recording) -> float:
    """The excess loss the minibatch gradient's own noise costs the optimizer, sum_i c_i Var(g_i)
    (c = Preconditioner.excess_loss_weight, divergence.py "Weight divergence"; `variance` from
    gradient_variance)."""
    weights = rec.preconditioner.excess_loss_weight
    return sum(float((weights[p] * v).sum()) for p, v in variance.items() if p in weights)


# LayerStats' scalar fields: the numbers that averaging over batches or ranks averages (with the errors)
LAYER_NUMBERS = ("out_rms", "grad_out_rms", "grad_in_rms", "weight_grad_rms", "curvature", "s_dgrad", "s_wgrad")


@dataclass(frozen=True)
class LayerStats:
    """The per-layer numbers behind a plan (JSON-able)."""

    shape: LayerShape
    out_rms: float          # RMS of the output y
    grad_out_rms: float     # RMS of dy
    grad_in_rms: float      # RMS of this layer's dgrad output dx = dy w
    weight_grad_rms: float  # RMS of dW
    curvature: float        # h_l: loss increase per unit relative output noise energy (§4.3)
    s_dgrad: float          # WD per unit relative dgrad noise energy (§4.4), an excess training loss
    s_wgrad: float          # same for wgrad noise
    errors: Mapping[str, Mapping[str, float]]  # precision -> GEMM -> relative squared error (§4.2)

    @property
    def name(self) -> str:
        return self.shape.name

    def ld(self, precision: str) -> float:
        """LD(l, p) = h_l e_fwd(l, p), the expected loss increase from quantizing the forward GEMM.

        A negative measured curvature (seen near initialisation) would make noise look beneficial;
        quantization is never rewarded, so h_l is floored at 0 here (the raw value stays in `curvature`).
        """
        return max(self.curvature, 0.0) * self.errors[precision]["fprop"]

    def wd(self, precision: str, gemm: str | None = None) -> float:
        """WD(l, p) = s_dgrad e_dgrad + s_wgrad e_wgrad (or one term, for `gemm` "dgrad" / "wgrad")."""
        terms = {"dgrad": self.s_dgrad * self.errors[precision]["dgrad"],
                 "wgrad": self.s_wgrad * self.errors[precision]["wgrad"]}
        return terms[gemm] if gemm else terms["dgrad"] + terms["wgrad"]

    def to_json(self) -> dict:
        out = asdict(self)
        out["shape"] = asdict(self.shape)
        out["errors"] = {p: dict(e) for p, e in self.errors.items()}
        return out

    @classmethod
    def from_json(cls, obj: Mapping) -> "LayerStats":
        fields = dict(obj)
        # statistics written while LD had a directional form carry its per-precision factors: empty where it was
        # off (those load as they are), set where it was on (LD would be priced otherwise than they were measured)
        if fields.pop("fprop_alignment", None):
            raise ValueError(f"the statistics of layer {obj['shape']['name']!r} were measured with the directional LD "
                             "(fprop_alignment), which the planner no longer has: re-collect the statistics")
        fields["shape"] = LayerShape(**obj["shape"])
        fields["errors"] = {p: {g: float(e[g]) for g in GEMMS} for p, e in obj["errors"].items()}
        return cls(**fields)


@dataclass(frozen=True)
class PlannerStats:
    """Everything one measurement produced: per-layer stats plus the calibration loss and diagnostics."""

    layers: tuple[LayerStats, ...]
    loss: float
    step: int | None = None
    preconditioner: str = ""
    diagnostics: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self):
        names = [s.name for s in self.layers]
        if len(set(names)) != len(names):
            raise ValueError("duplicate layer names in the statistics")

    def by_name(self) -> dict[str, LayerStats]:
        return {s.name: s for s in self.layers}

    def candidates(self) -> set[str]:
        """Precisions whose quantization errors were measured on every layer."""
        sets = [set(s.errors) for s in self.layers]
        return set.intersection(*sets) if sets else set()

    def to_vector(self) -> list[float]:
        """The loss and every per-layer number (the scalar fields, then the errors, precisions in sorted order),
        flat: what averaging over batches or data-parallel ranks averages (`with_vector`)."""
        flat = [self.loss]
        for s in self.layers:
            flat += [getattr(s, f) for f in LAYER_NUMBERS]
            flat += [s.errors[p][g] for p in sorted(s.errors) for g in GEMMS]
        return flat

    def with_vector(self, values: Sequence[float]) -> "PlannerStats":
        """These statistics with the numbers of `values` (laid out as `to_vector` lays them out)."""
        expected = 1 + sum(len(LAYER_NUMBERS) + len(s.errors) * len(GEMMS) for s in self.layers)
        if len(values) != expected:
            raise ValueError(f"expected {expected} numbers for these statistics, got {len(values)}")
        loss, pos, layers = float(values[0]), 1, []
        for s in self.layers:
            nums = {f: float(v) for f, v in zip(LAYER_NUMBERS, values[pos:pos + len(LAYER_NUMBERS)])}
            pos += len(LAYER_NUMBERS)
            errors = {}
            for p in sorted(s.errors):
                errors[p] = {g: float(v) for g, v in zip(GEMMS, values[pos:pos + len(GEMMS)])}
                pos += len(GEMMS)
            layers.append(replace(s, errors=errors, **nums))
        return replace(self, layers=tuple(layers), loss=loss)

    def to_json(self) -> dict:
        return {"loss": self.loss, "step": self.step, "preconditioner": self.preconditioner,
                "diagnostics": dict(self.diagnostics), "wd_units": WD_UNITS,
                "layers": [s.to_json() for s in self.layers]}

    @classmethod
    def from_json(cls, obj: Mapping) -> "PlannerStats":
        units = obj.get("wd_units")
        if units != WD_UNITS:
            was = "no WD units (written before WD was an excess loss)" if units is None else f"WD in {units!r} units"
            raise ValueError(f"these planner statistics have {was}; the planner prices WD as an excess training loss "
                             f"(wd_units {WD_UNITS!r}) only: re-collect the statistics")
        return cls(tuple(LayerStats.from_json(s) for s in obj["layers"]), float(obj["loss"]), obj.get("step"),
                   obj.get("preconditioner", ""), dict(obj.get("diagnostics", {})))


def mean_stats(stats: Sequence[PlannerStats]) -> PlannerStats:
    """The mean of measurements of the same layers (on several batches): every per-layer number, the loss
    and each diagnostic that all of them have, averaged; step and preconditioner are the first's."""
    if not stats:
        raise ValueError("no statistics to average")
    first = stats[0]
    key = [(s.shape, sorted(s.errors)) for s in first.layers]
    for other in stats[1:]:
        if [(s.shape, sorted(s.errors)) for s in other.layers] != key:
            raise ValueError("the statistics to average measure different layers, shapes or candidates")
    mean = [math.fsum(column) / len(stats) for column in zip(*(s.to_vector() for s in stats))]
    diagnostics = {k: math.fsum(s.diagnostics[k] for s in stats) / len(stats) for k in first.diagnostics
                   if all(k in s.diagnostics for s in stats)}
    return replace(first.with_vector(mean), diagnostics=diagnostics)
