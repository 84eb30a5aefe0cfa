"""`snip plan`: a SNIP plan computed offline for a model the user brings, on the user's own data.

    snip plan --hf path/to/llama --data calib.txt --budget fp4=0.75 --out plans/llama
    snip plan --preset tiny --weights runs/x/model.pt --data tokens.npy --budget cost=0.3 --out plans/tiny

The model is a local Hugging Face Llama-family directory (`load_hf_model`, no network) or a snip preset
with the weights `snip train --save` wrote (`load_preset_model`). The data is a text file (or a directory
of them), tokenized by the directory's tokenizer or, for a preset, into bytes as `snip train` does, or a
token file (.npy / .bin, `read_tokens`). `calibration_batches` draws `--batches` windows of
`--batch-size` x (`--seq-len` + 1) tokens; `plan_offline` measures the planner's statistics on each
batch, averages them (`planner.mean_stats`) and solves the ILP at the budget. The command prints the plan
table and writes `plan.json` (planner.Plan's snip-plan/1 JSON) and `plan.png` (the heat map) into `--out`:

    snip train --preset tiny --precision plans/tiny/plan.json          # a preset's plan
    snip_ops.convert(model, Plan.load("plans/llama/plan.json").precisions)   # the HF model's (FQNs)

No training happens, so there is no optimizer state: the weight divergence uses what SnipPlanner uses
before Adam's first step, each tensor's gradient second moment as Adam's v, at the learning rate `--lr`,
over the `--wd-horizon` steps the plan will be used for.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:  # imported where used: snip_train.cli imports this module to register the command
    import numpy as np
    import torch
    from torch import nn

    from planner import Plan, PlannerConfig

__all__ = ["PLAN_HELP", "PLAN_DESCRIPTION", "LLAMA_FAMILY", "TOKEN_FILES", "add_plan_arguments",
           "run_plan_command", "planner_config_from_args", "load_hf_model", "load_hf_tokenizer", "load_preset_model",
           "read_tokens", "calibration_batches", "causal_lm_logits", "causal_lm_loss",
           "plan_offline"]

PLAN_HELP = "compute a SNIP plan offline for a trained model (a Hugging Face Llama directory or a snip preset)"

# Hugging Face model types of dense causal decoders with Llama's nn.Linear projections (q/k/v/o,
# gate/up/down), each run once per forward as the planner's statistics need (tests/train/test_plan_command.py
# plans each). Mixture-of-experts models are not among them: an expert that no calibration token is routed
# to cannot be measured.
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "olmo", "olmo2", "granite")

PLAN_DESCRIPTION = (
    "Measure the SNIP planner's statistics on calibration batches of your data and solve its ILP at a budget, "
    "without training: prints the plan table and writes OUT/plan.json (use it with `snip train --precision "
    "OUT/plan.json` or snip_ops.convert(model, Plan.load(path).precisions)) and OUT/plan.png (the heat map). "
    f"The model: --hf DIR, a local Hugging Face directory of a {', '.join(LLAMA_FAMILY)} causal LM, loaded "
    "without network in float32; or --preset NAME --weights model.pt (from `snip train --save`). Without "
    "training there is no Adam state: the weight divergence takes each weight tensor's gradient second moment "
    "on the calibration batch as Adam's v (what the planner does before the optimizer's first step) and the "
    "learning rate --lr.")

TOKEN_FILES = (".npy", ".bin")  # token ids (snip_train.data); any other file or a directory is text
DEFAULT_SEQ_LEN = 128           # tokens per calibration sequence, unless the model's context is shorter
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


# ---------------------------------------------------------------------------------------
# arguments
# ---------------------------------------------------------------------------------------
def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    from planner import PlannerConfig, StatsConfig

    from .data import DEFAULT_MAX_BYTES
    from .model import PRESETS
    from .planning import wd_horizon_arg

    d, ds = PlannerConfig(), StatsConfig()
    g = p.add_argument_group("model (one of)")
    source = g.add_mutually_exclusive_group(required=True)
    source.add_argument("--hf", metavar="DIR",
                        help=f"a local Hugging Face directory (save_pretrained) of a {', '.join(LLAMA_FAMILY)} "
                             "causal LM; its tokenizer, when the directory has one, tokenizes text data")
    source.add_argument("--preset", choices=sorted(PRESETS), help="a snip model preset, with --weights")
    g.add_argument("--weights", metavar="PT", help="the preset's weights: model.pt of `snip train --save`")
    g = p.add_argument_group("calibration data")
    g.add_argument("--data", required=True, metavar="PATH",
                   help="a token file (.npy: 1-D integer array; .bin: raw unsigned tokens) or text (a file or a "
                        f"directory, the first {DEFAULT_MAX_BYTES // 2**20} MiB): tokenized by the --hf directory's "
                        "tokenizer, or into bytes for a preset")
    g.add_argument("--token-dtype", default=None, choices=["uint8", "uint16", "uint32"],
                   help="element type of a .bin token file (default: uint16)")
    g.add_argument("--batches", type=int, default=4, metavar="N",
                   help="calibration batches: the statistics of each are measured and averaged (default: %(default)s)")
    g.add_argument("--batch-size", type=int, default=8, metavar="B",
                   help="sequences per calibration batch, as a training step would have (default: %(default)s)")
    g.add_argument("--seq-len", type=int, default=None, metavar="T",
                   help=f"tokens per sequence (default: {DEFAULT_SEQ_LEN}, or the model's context if shorter)")
    g.add_argument("--seed", type=int, default=0, help="seed of the calibration windows' positions (default: 0)")
    g = p.add_argument_group("plan")
    g.add_argument("--budget", default="fp4=0.75", metavar="BUDGET",
                   help="'fp4=0.75' (>= 75%% of linear FLOPs in FP4) or 'cost=0.3' (<= 0.3 x the all-bf16 cost) "
                        "(default: %(default)s)")
    g.add_argument("--granularity", choices=("layer", "gemm"), default=d.granularity,
                   help="one precision per layer, or per GEMM (fprop, dgrad, wgrad) (default: %(default)s)")
    g.add_argument("--wd-horizon", type=wd_horizon_arg, default=d.interval, metavar="{N,settled}",
                   help="WD prices the excess loss gradient noise causes within the N steps the plan will be used "
                        "for, or once settled (default: %(default)s)")
    g.add_argument("--candidates", default=",".join(d.candidates), metavar="P,P",
                   help="candidate precisions, high to low (default: %(default)s)")
    g.add_argument("--lam", type=float, default=d.lam, metavar="LAMBDA",
                   help="weight of WD against LD/L in the objective (default: %(default)s)")
    g.add_argument("--lr", type=float, default=ds.default_lr,
                   help="learning rate of the training the plan is for: the weight divergence (the loss Adam pays "
                        "for gradient noise) is proportional to it (default: %(default)s)")
    g.add_argument("--cost-table", default=None, metavar="JSON",
                   help="measured GEMM times (bench output) for a 'cost=' budget (default: theoretical FLOP cost)")
    g.add_argument("--pin", action="append", default=[], metavar="PATTERN=PREC",
                   help="keep matching layers at a precision, e.g. 'model.layers.0.*=fp8' (repeatable)")
    g = p.add_argument_group("run")
    g.add_argument("--out", required=True, metavar="DIR", help="where plan.json and plan.png go")
    g.add_argument("--device", default="auto", metavar="{auto,cpu,cuda}", help="(default: %(default)s)")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")


def planner_config_from_args(args: argparse.Namespace) -> "PlannerConfig":
    """The PlannerConfig of `snip plan`'s flags (checked before any model is loaded)."""
    from planner import Budget, MeasuredCost, PlannerConfig, StatsConfig

    cost = MeasuredCost.from_json(args.cost_table) if args.cost_table else None
    pins = {}
    for item in args.pin:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--pin expects PATTERN=PRECISION, got {item!r}")
        pins[key] = value
    return PlannerConfig(
        candidates=tuple(c.strip() for c in args.candidates.split(",") if c.strip()),
        budget=Budget.parse(args.budget, cost), lam=args.lam, granularity=args.granularity,
        wd_horizon=args.wd_horizon, pinned=pins,
        stats=StatsConfig(default_lr=args.lr))


# ---------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------
def load_hf_model(directory: str | os.PathLike) -> "nn.Module":
    """The causal LM of a local Hugging Face directory, in float32, without network access.

    FileNotFoundError: no such directory, or no config.json in it. ValueError: its model type is not in
    LLAMA_FAMILY. ImportError: transformers is not installed."""
    import torch

    path = _hf_directory(directory)
    transformers = _transformers()
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    if config.model_type not in LLAMA_FAMILY:
        raise ValueError(f"{path}: model type {config.model_type!r} is not a Llama-family causal LM; "
                         f"snip plan --hf accepts {', '.join(LLAMA_FAMILY)}")
    return transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)


def load_hf_tokenizer(directory: str | os.PathLike):
    """The tokenizer saved in a Hugging Face directory; None when it has none."""
    path = _hf_directory(directory)
    if not any((path / f).is_file() for f in _TOKENIZER_FILES):
        return None
    return _transformers().AutoTokenizer.from_pretrained(path, local_files_only=True)


def _hf_directory(directory: str | os.PathLike) -> Path:
    path = Path(directory)
    if not path.is_dir():
        raise FileNotFoundError(f"--hf {path}: no such directory (expected a Hugging Face model directory, "
                                "as save_pretrained writes it)")
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"--hf {path}: no config.json (expected a Hugging Face model directory, as "
                                "save_pretrained writes it)")
    return path


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError("snip plan --hf needs the transformers package: pip install transformers") from None
    return transformers


def load_preset_model(preset: str, weights: str | os.PathLike) -> "nn.Module":
    """A snip Llama with the weights of `snip train --save` (model.pt: the model's config and state dict).

    The checkpoint's config must be the preset's, up to the vocabulary size and context length that
    `snip train` adapts to its data and --seq-len."""
    import torch

    from .model import Llama, LlamaConfig

    expected = LlamaConfig.preset(preset)  # ValueError for an unknown preset, naming the known ones
    path = Path(weights)
    if not path.is_file():
        raise FileNotFoundError(f"--weights {path}: no such file (expected model.pt of `snip train --save`)")
    what = "expected model.pt of `snip train --save`, a dict with 'model_config' and 'model'"
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch.load raises many types for a file that is no torch checkpoint
        raise ValueError(f"--weights {path}: not readable by torch.load ({type(e).__name__}: {e}); {what}") from None
    if not (isinstance(checkpoint, dict) and isinstance(checkpoint.get("model_config"), dict)
            and isinstance(checkpoint.get("model"), dict)):
        raise ValueError(f"--weights {path}: not a `snip train --save` checkpoint; {what}")
    config, state = LlamaConfig(**checkpoint["model_config"]), checkpoint["model"]
    adapted = dataclasses.replace(config, vocab_size=expected.vocab_size, max_seq_len=expected.max_seq_len)
    if adapted != expected:
        raise ValueError(f"--weights {path} holds a model of another shape than preset {preset!r}: {config}")
    model = Llama(config)
    model.load_state_dict(state)  # float32 parameters, whatever the stored dtype (--weights bf16_sr stores BF16)
    return model


def _model_source(args: argparse.Namespace):
    """(model, tokenize or None for byte tokens, loss_fn, logits_fn, a description) of the parsed flags."""
    if args.preset is not None:
        return load_preset_model(args.preset, args.weights), None, None, None, f"preset {args.preset}, {args.weights}"
    # the tokenizer is checked before the (large) model is loaded
    tokenize = None if _is_token_file(args.data) else _text_tokenizer(args.hf, args.data)
    model = load_hf_model(args.hf)
    return model, tokenize, causal_lm_loss, causal_lm_logits, f"{args.hf} ({model.config.model_type})"


def _text_tokenizer(directory: str | os.PathLike, data: str | os.PathLike) -> Callable[[str], Sequence[int]]:
    """text -> token ids, by the tokenizer saved in a Hugging Face directory (no special tokens added)."""
    tokenizer = load_hf_tokenizer(directory)
    if tokenizer is None:
        raise ValueError(f"--data {data} is text and {directory} has no tokenizer ({', '.join(_TOKENIZER_FILES)}): "
                         "save one there (tokenizer.save_pretrained) or pass token ids as .npy or .bin")
    return lambda text: tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]


def _is_token_file(path: str | os.PathLike) -> bool:
    return Path(path).is_file() and Path(path).suffix in TOKEN_FILES


def _context_length(model: "nn.Module") -> int:
    config = model.config
    return config.max_seq_len if hasattr(config, "max_seq_len") else config.max_position_embeddings


def _vocab_size(model: "nn.Module") -> int:
    return model.config.vocab_size


# ---------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------
def read_tokens(path: str | os.PathLike, vocab_size: int, tokenize: Callable[[str], Sequence[int]] | None = None,
                token_dtype: str | None = None) -> "np.ndarray":
    """The token ids of `path`: a token file (TOKEN_FILES) as it is; text (a file or a directory, the first
    data.DEFAULT_MAX_BYTES) through `tokenize`, or as bytes (snip's byte-level tokens) when `tokenize` is None.
    Every id must be below the model's `vocab_size`.

    FileNotFoundError: no such path. ValueError: a malformed token file, text that is not UTF-8 (with a
    tokenizer), or an id outside [0, vocab_size)."""
    import numpy as np

    from .data import DEFAULT_MAX_BYTES, load_corpus

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"--data {p}: no such file or directory")
    if _is_token_file(p):
        tokens = load_corpus(p, token_dtype=token_dtype)
    else:
        data = load_corpus(p, max_bytes=DEFAULT_MAX_BYTES)
        if tokenize is None:
            tokens = data
        else:
            try:
                text = bytes(data).decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"--data {p}: not UTF-8 text ({e}); pass token ids as .npy or .bin") from None
            tokens = np.asarray(tokenize(text), dtype=np.int64)
    if len(tokens) == 0:
        raise ValueError(f"--data {p}: no tokens")
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(f"--data {p}: token ids span [{low}, {high}], the model's vocabulary is [0, {vocab_size})")
    return tokens


def calibration_batches(tokens: "np.ndarray", batches: int, batch_size: int, seq_len: int,
                        seed: int = 0) -> "list[torch.Tensor]":
    """`batches` int64 tensors [batch_size, seq_len + 1] of windows at uniformly random positions of the
    whole token stream (a seeded generator: the same windows for the same arguments)."""
    import numpy as np
    import torch

    if batches < 1 or batch_size < 1 or seq_len < 1:
        raise ValueError(f"batches, batch size and sequence length must be >= 1, got {batches}, {batch_size}, "
                         f"{seq_len}")
    window = seq_len + 1
    if len(tokens) < window:
        raise ValueError(f"the data holds {len(tokens)} tokens; a calibration window needs {window} "
                         "(--seq-len + 1): pass more data or a shorter --seq-len")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(len(tokens) - window + 1, (batches, batch_size), generator=gen).numpy()
    return [torch.from_numpy(np.stack([np.asarray(tokens[s:s + window]) for s in row]).astype(np.int64))
            for row in starts]


# ---------------------------------------------------------------------------------------
# planning
# ---------------------------------------------------------------------------------------
def causal_lm_logits(model: "nn.Module", window: "torch.Tensor") -> "torch.Tensor":
    """A Hugging Face causal LM's logits [B, T, vocabulary] for a window batch [B, T + 1] (inputs
    window[:, :-1]; no key-value cache: the planner runs whole sequences)."""
    return model(input_ids=window[:, :-1], use_cache=False).logits


def causal_lm_loss(model: "nn.Module", window: "torch.Tensor") -> "torch.Tensor":
    """Mean next-token cross-entropy of window[:, 1:] given window[:, :-1], in float32 (snip's Llama.loss
    for a Hugging Face causal LM)."""
    from torch.nn import functional as F

    logits = causal_lm_logits(model, window)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))


def plan_offline(model: "nn.Module", batches: "Sequence[torch.Tensor]", config: "PlannerConfig", *,
                 loss_fn: Callable | None = None, logits_fn: Callable | None = None) -> "tuple[Plan, dict]":
    """(The plan of `config` for `model` from the mean statistics of `batches`, timings in seconds).

    `model` is converted in place (its nn.Linear layers become SnipLinear, the embedding and output head
    excepted) and left in bf16: the plan is not installed. No optimizer: see the module docstring.
    `loss_fn` / `logits_fn` default to `model.loss(window)` and `model(window[:, :-1])` (snip's Llama)."""
    from planner import SnipPlanner, mean_stats

    if not batches:
        raise ValueError("plan_offline needs at least one calibration batch")
    planner = SnipPlanner(model, None, config, loss_fn=loss_fn, logits_fn=logits_fn)
    t0 = time.perf_counter()
    stats = mean_stats([planner.measure(b) for b in batches])
    t1 = time.perf_counter()
    plan = planner.solve(stats)
    return plan, {"measure_s": t1 - t0, "solve_s": time.perf_counter() - t1}


# ---------------------------------------------------------------------------------------
# the command
# ---------------------------------------------------------------------------------------
def run_plan_command(args: argparse.Namespace) -> int:
    import torch

    from planner import InfeasibleBudget

    from .errors import UsageError, user_input
    from .plots import plot_plan_heatmap
    from .train import resolve_device

    with user_input():  # everything the user gave is read and checked before the measurement
        config = planner_config_from_args(args)
        if args.preset is not None and args.weights is None:
            raise ValueError("--preset needs --weights model.pt (the weights `snip train --save` wrote): a plan is "
                             "made for trained weights")
        if args.hf is not None and args.weights is not None:
            raise ValueError("--weights goes with --preset; a Hugging Face directory holds its own weights")
        if args.threads is not None and args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        if not Path(args.data).exists():
            raise FileNotFoundError(f"--data {args.data}: no such file or directory")
        device = resolve_device(args.device)
        if args.threads:
            torch.set_num_threads(args.threads)
        model, tokenize, loss_fn, logits_fn, source = _model_source(args)
        _check_pins(model, config)
        seq_len = args.seq_len or min(DEFAULT_SEQ_LEN, _context_length(model))
        if seq_len > _context_length(model):
            raise ValueError(f"--seq-len {seq_len} exceeds the model's context length {_context_length(model)}")
        tokens = read_tokens(args.data, _vocab_size(model), tokenize, args.token_dtype)
        batches = calibration_batches(tokens, args.batches, args.batch_size, seq_len, args.seed)
    model = model.to(device).train()
    batches = [b.to(device) for b in batches]

    print(f"model: {source}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters | data: "
          f"{args.data}, {len(tokens)} tokens, {args.batches} calibration batches of {args.batch_size} x {seq_len} | "
          f"budget: {config.budget.describe()}, per {config.granularity}", flush=True)
    print(f"no optimizer state: weight divergence from each tensor's gradient second moment as Adam's v, "
          f"learning rate {config.stats.default_lr:g}", flush=True)
    try:
        plan, times = plan_offline(model, batches, config, loss_fn=loss_fn, logits_fn=logits_fn)
    except InfeasibleBudget as e:
        raise UsageError(f"--budget {args.budget}: {e}") from e

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plan.save(out / "plan.json")
    plot_plan_heatmap(plan, out / "plan.png")
    print(plan.table())
    print(f"FP4 FLOPs {100 * plan.metrics['fp4_fraction']:.1f}%, cost {plan.metrics['relative_cost']:.3f} x bf16 | "
          f"measured in {times['measure_s']:.1f}s, solved in {times['solve_s']:.2f}s | {out / 'plan.json'}, "
          f"{out / 'plan.png'}", flush=True)
    return 0


def _check_pins(model: "nn.Module", config: "PlannerConfig") -> None:
    """Each --pin matches a planned layer (a linear layer, not the embedding or the output head) and names a
    candidate or bf16: the ILP would reject it too, but only after the measurement."""
    import fnmatch

    from torch import nn

    from snip_ops import LinearPrecision
    from snip_ops.formats import GEMMS
    from snip_ops.module import DEFAULT_EXCLUDE

    planned = [n for n, m in model.named_modules()
               if isinstance(m, nn.Linear) and not any(fnmatch.fnmatchcase(n, p) for p in DEFAULT_EXCLUDE)]
    allowed = {*config.candidates, "bf16"}
    for pattern, precision in config.pinned.items():
        if not any(n == pattern or fnmatch.fnmatchcase(n, pattern) for n in planned):
            raise ValueError(f"--pin {pattern!r} matches no planned layer; they are named like {planned[0]!r}")
        names = {LinearPrecision.of(precision).gemm(g).name for g in GEMMS}
        if not names <= allowed:
            raise ValueError(f"--pin {pattern}={precision}: a pinned precision must be a candidate or bf16 "
                             f"({', '.join(sorted(allowed))})")
