"""The ``snip`` command line (also ``python -m snip_train``): the one place commands are registered.

    snip train --preset tiny --steps 300 --precision fp4_mlp

Subcommands live in the ``COMMANDS`` registry: each is a name, a one-line help, a function that
adds its arguments to an ``argparse`` sub-parser, and a function that runs it and returns an exit
code: ``train`` (here, with the planner flags of ``planning``), ``sweep`` (``stability.command``),
``bench`` (the scripts of ``bench/``), ``cost`` (``cost_command``: a measured GEMM cost table) and ``doctor``
(``doctor``: the kernels on this GPU).

User errors (``snip_train.errors.UsageError``: a bad flag value, an unreadable or malformed input file,
incompatible flags, a checkpoint of another run, a GPU benchmark without a GPU) print one line,
``snip: error: <what was wrong and what is accepted>``, and exit with status 2; ``snip --debug ...``
shows their traceback instead. Any other exception is a bug and keeps its traceback. Input is checked
before anything is loaded or trained where that is cheap.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NoReturn

from .errors import UsageError, user_input

__all__ = ["main", "build_parser", "Command", "COMMANDS"]


@dataclass(frozen=True)
class Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None  # the sub-command's --help text (default: `help`)


class _Parser(argparse.ArgumentParser):
    """Reports a bad command line as a `UsageError` (one `snip: error:` line from `main`), not as
    argparse's usage text and exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def _count(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def _parse_size(s: str) -> int | None:
    """'8M', '512k', '1G', '1000000' -> bytes; 'all' / '0' -> None (no cap)."""
    if s.strip().lower() in ("all", "none"):
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)[bB]?\s*", s)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {s!r} (e.g. 8M, 512k, all)")
    n = float(m.group(1)) * {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[m.group(2).lower()]
    return int(n) or None


# ---------------------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------------------
def _add_train_args(p: argparse.ArgumentParser) -> None:
    from .model import PRESETS
    from .planning import LIVE_PLANNER, add_planner_args
    from .train import PLAN_PRESETS, WEIGHT_MODES, TrainConfig

    d = TrainConfig()
    g = p.add_argument_group("model and optimisation")
    g.add_argument("--preset", default=d.preset, choices=sorted(PRESETS), help="model size (default: %(default)s)")
    g.add_argument("--steps", type=_count(1), default=d.steps,
                   help="training steps; with --planner the warm-up and branch steps together, the learning-rate "
                        "schedule spanning both (default: %(default)s)")
    g.add_argument("--batch-size", type=_count(1), default=d.batch_size,
                   help="sequences per step (default: %(default)s)")
    g.add_argument("--seq-len", type=_count(1), default=None,
                   help="tokens per sequence (default: the preset's max_seq_len)")
    g.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (default: %(default)s)")
    g.add_argument("--warmup", type=_count(0), default=None, help="warmup steps (default: 10%% of steps, at most 100)")
    g.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW weight decay (default: %(default)s)")
    g.add_argument("--grad-clip", type=float, default=d.grad_clip, help="gradient norm clip, 0 = off (default: %(default)s)")
    g.add_argument("--weights", default=d.weights, choices=WEIGHT_MODES,
                   help="parameter storage: fp32 (torch AdamW), bf16_sr (BF16 parameters, snip AdamW with "
                        "stochastic rounding, no FP32 master), bf16_nearest (the same, round to nearest) "
                        "(default: %(default)s)")
    g = p.add_argument_group("precision")
    g.add_argument("--precision", default="bf16", metavar="PLAN",
                   help=f"{' | '.join(PLAN_PRESETS)} (presets), a precision name applied to every linear "
                        f"(fp8, fp4, mxfp8, nvfp4, mxfp4, ...), a plan .json file {{layer or glob: precision}}, or "
                        f"'{LIVE_PLANNER}': chosen as the run goes by the SNIP planner (its flags below) "
                        f"(default: %(default)s)")
    g = p.add_argument_group("data")
    g.add_argument("--corpus", default=None, metavar="PATH",
                   help="text file, directory, or token file (.npy / .bin); default: the Python stdlib sources")
    g.add_argument("--max-bytes", type=_parse_size, default=d.max_bytes, metavar="SIZE",
                   help="cap on text corpus size, e.g. 8M, 64M, all (default: 8M)")
    g.add_argument("--token-dtype", default=None, choices=["uint8", "uint16", "uint32"],
                   help="element type of a raw .bin token file (default: uint16)")
    g = p.add_argument_group("run")
    g.add_argument("--seed", type=int, default=d.seed, help="seed for init, data order, everything (default: %(default)s)")
    g.add_argument("--device", default=d.device, metavar="{auto,cpu,cuda}", help="(default: %(default)s)")
    g.add_argument("--threads", type=_count(1), default=None, help="torch CPU threads (default: torch's choice)")
    g.add_argument("--eval-interval", type=_count(0), default=d.eval_interval,
                   help="validate every N steps, 0 = only at start and end (default: %(default)s)")
    g.add_argument("--eval-batches", type=_count(0), default=d.eval_batches,
                   help="validation batches (default: %(default)s)")
    g.add_argument("--out", default=None, metavar="DIR", help="output directory (default: runs/<name>)")
    g.add_argument("--name", default=None, help="run name (default: <preset>-<precision>-<timestamp>)")
    g.add_argument("--save", action="store_true", help="also save the model weights (model.pt)")
    g.add_argument("--deterministic", action="store_true", help="torch.use_deterministic_algorithms (GPU)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = p.add_argument_group("checkpoints (one run, with or without --precision snip; not --planner)")
    g.add_argument("--checkpoint-interval", type=_count(1), default=None, metavar="N",
                   help="write OUT/checkpoint.pt every N steps, atomically (default: none; with --resume: the "
                        "checkpoint's)")
    g.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the run whose checkpoint is in DIR (its --out), bit for bit as if it had not "
                        "stopped, with the flags it was started with (the checkpoint holds them). Flags given "
                        "beside it must agree with the checkpoint, except --steps N (a longer or shorter run: "
                        "the warmup stays, the cosine decay spans N steps from here on), --checkpoint-interval, "
                        "--threads, --name, --save and --no-progress")
    add_planner_args(p)


def _check_train_flags(args: argparse.Namespace) -> None:
    """Flags that do not go together (each flag's own value is checked where it is used)."""
    from .planning import COMPARISON_FLAGS, LIVE_PLANNER

    if not args.planner:
        given = [flag for flag, dest in COMPARISON_FLAGS.items() if getattr(args, dest) is not None]
        if given:
            raise UsageError(f"{', '.join(given)}: only for the --planner comparison; add --planner or leave "
                             f"{'it' if len(given) == 1 else 'them'} out")
        return
    if args.precision != "bf16":
        raise UsageError(f"--planner compares bf16, SNIP and baselines branched from one bf16 warm-up and takes no "
                         f"--precision (got {args.precision!r}); for one run whose precision the planner chooses, "
                         f"use --precision {LIVE_PLANNER} without --planner")
    if args.resume or args.checkpoint_interval:
        raise UsageError("--checkpoint-interval and --resume are for one run (with or without --precision "
                         f"{LIVE_PLANNER}), not for the --planner comparison")
    if args.branch_at is not None and not 0 <= args.branch_at < args.steps:
        raise UsageError(f"--branch-at must be in 0..{args.steps - 1} (below --steps), got {args.branch_at}")


# `snip train` flags a run's checkpoint does not hold: where it is, and how this invocation reports errors.
_NOT_INHERITED = ("resume", "out", "debug")


def _command(args: argparse.Namespace) -> dict:
    """The `snip train` flags of this run (every one, typed or default), for its checkpoints: `--resume`
    alone continues the run with them."""
    return {k: v for k, v in vars(args).items() if not k.startswith("_") and k not in _NOT_INHERITED}


def _inherit_command(args: argparse.Namespace, resume) -> None:
    """Give the flags not typed beside --resume the values the checkpoint's run was started with. Typed
    ones are kept, and checked against the checkpoint later (`train._check_resume`, the planner's
    hooks). A new --steps keeps the run's warmup (which defaults to a share of the steps)."""
    from .train import saved_warmup_steps

    saved = resume.config.get("command")
    typed = getattr(args, "_typed", None)  # None: not parsed by `main`, every flag counts as typed
    if saved is None or typed is None:  # a checkpoint from before the command was recorded: the flags are the run's
        return
    for dest, value in saved.items():
        if dest not in typed and hasattr(args, dest):  # a flag this version no longer has stays out
            setattr(args, dest, value)
    if args.steps != saved.get("steps") and "warmup" not in typed and args.warmup is None:
        args.warmup = saved_warmup_steps(resume.config)


def _run_train(args: argparse.Namespace) -> int:
    import torch

    from .checkpoint import load_checkpoint
    from .planning import LIVE_PLANNER, comparison_from_args, config_from_args, make_hooks, run_comparison
    from .train import TrainConfig, check_config, learning_rates, train

    _check_train_flags(args)
    resume = None
    if args.resume:
        if args.out and Path(args.out).resolve() != Path(args.resume).resolve():
            raise UsageError(f"--resume continues the run in its own directory ({args.resume}); leave out --out "
                             f"(got {args.out})")
        resume = load_checkpoint(args.resume)
        _inherit_command(args, resume)
    live = args.precision == LIVE_PLANNER  # one run, the planner choosing its precision as it goes
    planner = config_from_args(args) if live else None
    comparison = comparison_from_args(args, args.steps)
    if args.threads:
        torch.set_num_threads(args.threads)
    prec_tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(args.precision).stem if args.precision.endswith(".json")
                      else args.precision)
    name = args.name or (resume.config.get("name") if resume is not None else None) or \
        f"{args.preset}-{prec_tag}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = args.resume or args.out or str(Path("runs") / name)
    interval = args.checkpoint_interval
    if interval is None:
        interval = resume.config.get("checkpoint_interval", 0) if resume is not None else 0
    cfg = TrainConfig(
        preset=args.preset, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
        warmup_steps=args.warmup, weight_decay=args.weight_decay, grad_clip=args.grad_clip or None, weights=args.weights,
        precision="bf16" if live else args.precision, precision_name=LIVE_PLANNER if live else None,
        corpus=args.corpus, max_bytes=args.max_bytes,
        token_dtype=args.token_dtype, seed=args.seed, device=args.device, eval_interval=args.eval_interval,
        eval_batches=args.eval_batches, out_dir=out, name=name, save_checkpoint=args.save,
        checkpoint_interval=interval, deterministic=args.deterministic, progress=not args.no_progress, verbose=True,
        command=_command(args),
    )
    check_config(cfg)  # before any data is loaded (train checks again)
    if comparison is not None:
        # a bf16 warm-up, then bf16, SNIP and the baselines branched from it on the same batches
        result = run_comparison(out, cfg, comparison)
        return 1 if any(b["diverged"] for b in result["branches"]) else 0
    hooks = None
    if live:  # checks a resumed planner's configuration against the checkpoint's
        hooks = make_hooks(planner, out_dir=out, resume=resume.hooks if resume is not None else None,
                           lr_schedule=learning_rates(cfg))
        cfg = dataclasses.replace(cfg, **hooks.train_kwargs())
    from planner import InfeasibleBudget

    try:
        s = train(cfg, resume=resume)
    except InfeasibleBudget as e:  # the budget the flags set, under the cost they priced it with
        raise UsageError(f"--planner-budget {args.planner_budget}: {e}") from e
    if hooks is not None:
        hooks.finish()  # plan.json, planner_state.json, plan.png
    init = s["initial_val_loss"]
    val = s["final_val_loss"]
    status = "DIVERGED" if s["diverged"] else "done"
    resumed = f" (resumed at step {s['resumed_at'][-1]})" if s["resumed_at"] else ""
    print(f"{status}: {s['steps']} steps{resumed} in {s['time_s']:.1f}s ({s['tokens_per_s'] / 1e3:.1f}k tok/s, "
          f"{s['step_time_s'] * 1e3:.0f} ms/step) | train loss {s['final_train_loss']:.3f} | "
          f"val loss {val:.3f} (init {init:.3f}) | {out}/summary.json, {out}/loss.png", flush=True)
    return 1 if s["diverged"] else 0


# ---------------------------------------------------------------------------------------
# bench
# ---------------------------------------------------------------------------------------
BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"
# `snip bench` NAME -> the module of the bench package it runs (the performance benchmarks; the planner-quality
# studies are the modules of experiments/, run with `python -m experiments.<study>`)
BENCHES = {"quant": "bench_quant", "gemm": "bench_gemm", "optim": "bench_optim", "planner-cost": "bench_planner_cost",
           "stability": "bench_stability"}
GPU_BENCHES = ("quant", "gemm", "optim gpu")  # `snip bench` NAME [first argument] that time CUDA kernels


def _add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=BENCHES, help="the benchmark: python -m bench.bench_<name> in the source tree")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="its arguments (see snip bench NAME --help)")


def _run_bench(args: argparse.Namespace) -> int:
    import os
    import subprocess

    import torch

    module = BENCHES[args.name]
    label = args.name if args.name in GPU_BENCHES else " ".join([args.name, *args.bench_args[:1]])
    asks_help = any(a in ("-h", "--help") for a in args.bench_args)
    if label in GPU_BENCHES and not asks_help and not torch.cuda.is_available():
        raise UsageError(f"snip bench {label} times CUDA kernels and needs a GPU; there is none here (on a CPU: "
                         "snip bench planner-cost, stability, optim quality|lr-range|memory)")
    if not (BENCH_DIR / f"{module}.py").exists():
        raise UsageError(f"{BENCH_DIR / module}.py not found (the benchmarks live in the source tree: install it "
                         "with pip install -e .)")
    # A process of its own with the source tree importable, run from here: its relative paths (--out, --results)
    # mean what they meant on this command line.
    paths = [str(BENCH_DIR.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run([sys.executable, "-m", f"bench.{module}", *args.bench_args], env=env, check=False).returncode


# ---------------------------------------------------------------------------------------
# doctor
# ---------------------------------------------------------------------------------------
def _add_doctor_args(p: argparse.ArgumentParser) -> None:
    default = BENCH_DIR / "results" if BENCH_DIR.is_dir() else Path.cwd()
    p.add_argument("--results", type=Path, default=default,
                   help="where <device>-doctor.json goes (default: bench/results of the source tree, else .)")


def _run_doctor(args: argparse.Namespace) -> int:
    from .doctor import doctor

    if args.results.exists() and not args.results.is_dir():
        raise UsageError(f"--results {args.results}: not a directory")

    return doctor(args.results)


# ---------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------
def _run_sweep(args: argparse.Namespace) -> int:
    """The sweep, after its grid was checked: the options, every precision, the corpus and the device."""
    from planner.stability import parse_scheme

    from .stability.cell import BASELINE, is_exmy_name
    from .stability.command import run_sweep_command, spec_from_args
    from .train import TrainConfig, check_config

    with user_input():
        spec = spec_from_args(args)
    setup = spec.setup
    for precision in spec.precisions:
        if precision == BASELINE:
            continue
        if is_exmy_name(precision):
            with user_input(f"precision {precision!r}"):
                parse_scheme(precision)
            continue
        check_config(TrainConfig(model=setup.model, precision=precision))
    check_config(TrainConfig(model=setup.model, corpus=setup.corpus, device=setup.device))
    return run_sweep_command(args)


def _sweep_command() -> Command:
    from .stability.command import SWEEP_DESCRIPTION, SWEEP_HELP, add_sweep_arguments

    return Command(SWEEP_HELP, add_sweep_arguments, _run_sweep, SWEEP_DESCRIPTION)


def _plan_command() -> Command:
    from .plan_command import PLAN_DESCRIPTION, PLAN_HELP, add_plan_arguments, run_plan_command

    return Command(PLAN_HELP, add_plan_arguments, run_plan_command, PLAN_DESCRIPTION)


def _cost_command() -> Command:
    from .cost_command import COST_HELP, add_cost_arguments, run_cost_command

    return Command(COST_HELP, add_cost_arguments, run_cost_command)


COMMANDS: dict[str, Command] = {
    "train": Command("train a small Llama-like model", _add_train_args, _run_train),
    "sweep": _sweep_command(),
    "plan": _plan_command(),
    "bench": Command("run a benchmark of bench/ (quant, gemm and optim gpu need a GPU); results go to "
                     "bench/results/", _add_bench_args, _run_bench),
    "cost": _cost_command(),
    "doctor": Command("run every compiled kernel on this GPU against the reference and time it (builds "
                      "nothing; without a GPU it says so)", _add_doctor_args, _run_doctor),
}


_DEBUG_HELP = "on a user error, show the traceback instead of the one-line message"


def build_parser(suppress_defaults: bool = False) -> argparse.ArgumentParser:
    """The `snip` parser; with `suppress_defaults` a flag that is not typed is left out of the result
    (what `main` uses to tell typed flags from defaults)."""
    parser = _Parser(prog="snip", description="snip: adaptive FP8/FP4 mixed-precision LLM training.")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        sp = sub.add_parser(name, help=cmd.help, description=cmd.description or cmd.help)
        cmd.add_arguments(sp)
        if not any("--debug" in a.option_strings for a in sp._actions):  # `snip train ... --debug` too
            sp.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)
        sp.set_defaults(_run=cmd.run)
        if suppress_defaults:
            for action in sp._actions:
                action.default = argparse.SUPPRESS
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command; returns its exit status: 2 after a user error, printed as one `snip: error:` line."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = None
    try:
        args = parser.parse_args(argv)
        if getattr(args, "_run", None) is None:
            parser.print_help()
            return 2
        args._typed = frozenset(vars(build_parser(suppress_defaults=True).parse_args(argv)))
        return int(args._run(args) or 0)
    except UsageError as e:
        if args.debug if args is not None else "--debug" in argv:
            raise
        print("snip: error: " + " ".join(str(e).split()), file=sys.stderr)  # one line
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
