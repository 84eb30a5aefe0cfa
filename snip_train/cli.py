"""The ``snip`` command line (also ``python -m snip_train``): the one place commands are registered.

    snip train --preset tiny --steps 300 --precision fp4_mlp

Subcommands live in the ``COMMANDS`` registry: each is a name, a one-line help, a function that
adds its arguments to an ``argparse`` sub-parser, and a function that runs it and returns an exit
code: ``train`` (here, with the planner flags of ``planning``), ``sweep`` (``stability.command``),
``bench`` (the scripts of ``bench/``) and ``doctor`` (``doctor``: the kernels on this GPU).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

__all__ = ["main", "build_parser", "Command", "COMMANDS"]


@dataclass(frozen=True)
class Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None  # the sub-command's --help text (default: `help`)


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
    from .train import PLAN_PRESETS, WEIGHT_MODES, TrainConfig

    d = TrainConfig()
    g = p.add_argument_group("model and optimisation")
    g.add_argument("--preset", default=d.preset, choices=sorted(PRESETS), help="model size (default: %(default)s)")
    g.add_argument("--steps", type=int, default=d.steps,
                   help="training steps; with --planner the warm-up and branch steps together, the learning-rate "
                        "schedule spanning both (default: %(default)s)")
    g.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per step (default: %(default)s)")
    g.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: the preset's max_seq_len)")
    g.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (default: %(default)s)")
    g.add_argument("--warmup", type=int, default=None, help="warmup steps (default: 10%% of steps, at most 100)")
    g.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW weight decay (default: %(default)s)")
    g.add_argument("--grad-clip", type=float, default=d.grad_clip, help="gradient norm clip, 0 = off (default: %(default)s)")
    g.add_argument("--weights", default=d.weights, choices=WEIGHT_MODES,
                   help="parameter storage: fp32 (torch AdamW), bf16_sr (BF16 parameters, snip AdamW with "
                        "stochastic rounding, no FP32 master), bf16_nearest (the same, round to nearest) "
                        "(default: %(default)s)")
    g = p.add_argument_group("precision")
    g.add_argument("--precision", default="bf16", metavar="PLAN",
                   help=f"{' | '.join(PLAN_PRESETS)} (presets), a precision name applied to every linear "
                        f"(fp8, fp4, mxfp8, nvfp4, mxfp4, ...), or a plan .json file {{layer or glob: precision}} "
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
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    g.add_argument("--eval-interval", type=int, default=d.eval_interval,
                   help="validate every N steps, 0 = only at start and end (default: %(default)s)")
    g.add_argument("--eval-batches", type=int, default=d.eval_batches, help="validation batches (default: %(default)s)")
    g.add_argument("--out", default=None, metavar="DIR", help="output directory (default: runs/<name>)")
    g.add_argument("--name", default=None, help="run name (default: <preset>-<precision>-<timestamp>)")
    g.add_argument("--save", action="store_true", help="also save the model weights (model.pt)")
    g.add_argument("--deterministic", action="store_true", help="torch.use_deterministic_algorithms (GPU)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    from .planning import add_planner_args

    add_planner_args(p)


def _run_train(args: argparse.Namespace) -> int:
    import torch

    from .planning import comparison_from_args, run_comparison
    from .train import TrainConfig, train

    if args.threads:
        torch.set_num_threads(args.threads)
    prec_tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(args.precision).stem if args.precision.endswith(".json")
                      else args.precision)
    name = args.name or f"{args.preset}-{prec_tag}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = args.out or str(Path("runs") / name)
    cfg = TrainConfig(
        preset=args.preset, steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
        warmup_steps=args.warmup, weight_decay=args.weight_decay, grad_clip=args.grad_clip or None, weights=args.weights,
        precision=args.precision, corpus=args.corpus, max_bytes=args.max_bytes, token_dtype=args.token_dtype,
        seed=args.seed, device=args.device, eval_interval=args.eval_interval, eval_batches=args.eval_batches,
        out_dir=out, name=name, save_checkpoint=args.save, deterministic=args.deterministic,
        progress=not args.no_progress, verbose=True,
    )
    comparison = comparison_from_args(args, cfg.steps)
    if comparison is not None:
        # a bf16 warm-up, then bf16, SNIP and the baselines branched from it on the same batches
        result = run_comparison(out, cfg, comparison)
        return 1 if any(b["diverged"] for b in result["branches"]) else 0
    s = train(cfg)
    init = s["initial_val_loss"]
    val = s["final_val_loss"]
    status = "DIVERGED" if s["diverged"] else "done"
    print(f"{status}: {s['steps']} steps in {s['time_s']:.1f}s ({s['tokens_per_s'] / 1e3:.1f}k tok/s, "
          f"{s['step_time_s'] * 1e3:.0f} ms/step) | train loss {s['final_train_loss']:.3f} | "
          f"val loss {val:.3f} (init {init:.3f}) | {out}/summary.json, {out}/loss.png", flush=True)
    return 1 if s["diverged"] else 0


# ---------------------------------------------------------------------------------------
# bench
# ---------------------------------------------------------------------------------------
BENCH_DIR = Path(__file__).resolve().parents[1] / "bench"
BENCHES = ("quant", "gemm", "optim", "planner", "stability")


def _add_bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", choices=BENCHES, help="bench/bench_<name>.py")
    p.add_argument("bench_args", nargs=argparse.REMAINDER, help="its arguments (see snip bench NAME --help)")


def _run_bench(args: argparse.Namespace) -> int:
    import runpy

    script = BENCH_DIR / f"bench_{args.name}.py"
    if not script.exists():
        print(f"snip bench: {script} not found (the benchmarks live in the source tree: install it with "
              "pip install -e .)", file=sys.stderr)
        return 2
    argv, path = sys.argv, list(sys.path)
    sys.argv = [str(script), *args.bench_args]
    sys.path.insert(0, str(BENCH_DIR))  # as `python bench/bench_<name>.py` has it: its sibling modules
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        if isinstance(e.code, str):  # sys.exit("message")
            print(e.code, file=sys.stderr)
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv, sys.path[:] = argv, path
    return 0


# ---------------------------------------------------------------------------------------
# doctor
# ---------------------------------------------------------------------------------------
def _add_doctor_args(p: argparse.ArgumentParser) -> None:
    default = BENCH_DIR / "results" if BENCH_DIR.is_dir() else Path.cwd()
    p.add_argument("--results", type=Path, default=default,
                   help="where <device>-doctor.json goes (default: bench/results of the source tree, else .)")


def _run_doctor(args: argparse.Namespace) -> int:
    from .doctor import doctor

    return doctor(args.results)


# ---------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------
def _sweep_command() -> Command:
    from .stability.command import SWEEP_DESCRIPTION, SWEEP_HELP, add_sweep_arguments, run_sweep_command

    return Command(SWEEP_HELP, add_sweep_arguments, run_sweep_command, SWEEP_DESCRIPTION)


COMMANDS: dict[str, Command] = {
    "train": Command("train a small Llama-like model", _add_train_args, _run_train),
    "sweep": _sweep_command(),
    "bench": Command("run a benchmark of bench/ (quant, gemm and optim gpu need a GPU); results go to "
                     "bench/results/", _add_bench_args, _run_bench),
    "doctor": Command("run every compiled kernel on this GPU against the reference and time it (builds "
                      "nothing; without a GPU it says so)", _add_doctor_args, _run_doctor),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="snip", description="snip: adaptive FP8/FP4 mixed-precision LLM training.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        sp = sub.add_parser(name, help=cmd.help, description=cmd.description or cmd.help)
        cmd.add_arguments(sp)
        sp.set_defaults(_run=cmd.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_run", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
