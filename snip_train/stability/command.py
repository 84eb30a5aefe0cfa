"""`snip sweep`: run a stability sweep (seeds x learning rates x precisions) and report it.

`add_sweep_arguments(parser)` adds the options, `run_sweep_command(args)` runs it; snip_train.cli
registers both as the "sweep" command (bench/bench_stability.py reuses them).

Outputs in --out: cells/<key>.json (one per finished cell; rerunning resumes), sweep.json (the grid),
summary.json (tables, verdicts, correlations), report.md, heatmap.png, sharpness.png (ours), and
epsilon-sharpness.png where the paper's sharpness was measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["SWEEP_HELP", "SWEEP_DESCRIPTION", "add_sweep_arguments", "spec_from_args", "run_sweep_command"]

SWEEP_HELP = "training-stability sweep: seeds x learning rates x precisions (eXmY simulation, plans)"


def _numbers(kind: type, what: str):
    """An argparse type for a comma-separated list of `kind`, whose error says what it expects."""
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(v) for v in text.split(",") if v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, e.g. "
                                             f"{'1e-3,3e-3' if kind is float else '0,1,2'}; got {text!r}") from None
    return parse


_floats = _numbers(float, "numbers")
_ints = _numbers(int, "integers")


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


SWEEP_DESCRIPTION = (
    "Train short runs of a small Llama for every (precision, learning rate, seed), record divergence, loss "
    "spikes and sharpness, and draw heat maps. Finished cells are kept in --out/cells and never rerun. "
    "Precisions: 'fp32' (no quantization), eXmY schemes ('e8m3', 'e4m3:sr', 'e5m2:tensor', "
    "'e2m1:sr:1x32:ops=grad:gemms=dgrad+wgrad'), or snip precisions / plans ('fp8', 'fp4', 'mxfp8', "
    "'fp4_mlp', plan.json); 'e8m3:paper' is the stability paper's masking simulation (same as 'e8m3:trunc'). "
    "Presets: cpu-quick (minutes on 2 cores), cpu (the bit-reduction measurement), cpu-paper (the paper's "
    "simulation and sharpness), gpu (25M model, 480 cells), gpu-1b; see snip_train/stability/presets.py."
)


def add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    """The sweep's options, on an existing parser."""
    from .presets import PRESETS

    p.add_argument("--preset", default="cpu-quick", choices=sorted(PRESETS),
                   help="grid to start from (see snip_train/stability/presets.py); the options below override it")
    p.add_argument("--precisions", type=_names, help="comma-separated precisions")
    p.add_argument("--lrs", type=_floats, help="comma-separated peak learning rates")
    p.add_argument("--seeds", type=_ints, help="comma-separated seeds")
    p.add_argument("--baseline", help="precision the offline divergence rule compares against ('none': no comparison)")
    p.add_argument("--model", help="model preset of snip_train (tiny, small, 1b)")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--corpus", help="text/token file or directory (default: the Python stdlib sources)")
    p.add_argument("--rho", type=float, help="relative weight perturbation of the sharpness metric")
    p.add_argument("--eps", type=float,
                   help="also measure the paper's epsilon-sharpness with this box size (0: do not measure it)")
    p.add_argument("--sharpness-every", type=int, help="measure sharpness every N steps (0: never)")
    p.add_argument("--baseline-nats", type=float,
                   help="offline divergence threshold over the baseline loss (analysis only: no retraining)")
    p.add_argument("--time-limit", type=float, help="seconds per cell before it stops (marked incomplete)")
    p.add_argument("--device", help="cpu, cuda or auto")
    p.add_argument("--out", help="output directory (default: runs/sweep-<preset>)")
    p.add_argument("--workers", type=int, help="parallel processes (default: one per core, at most one per cell)")
    p.add_argument("--threads", type=int, help="torch threads per worker (default: cores // workers)")
    p.add_argument("--report-only", action="store_true", help="analyse the cells already in --out, train nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    # command_line: how the report names the command; callers other than `snip sweep` set their own.
    p.set_defaults(command_line=None)


def spec_from_args(args: argparse.Namespace):
    """The SweepSpec of parsed sweep options: the preset with the given options replacing its fields."""
    from planner.stability import EpsilonSharpnessConfig

    from ..model import LlamaConfig
    from .presets import preset
    from .sweep import SweepSpec

    spec = preset(args.preset)
    setup = spec.setup
    seq_len = args.seq_len or setup.seq_len
    model = setup.model
    if args.model:
        model = LlamaConfig.preset(args.model, max_seq_len=seq_len)
    elif seq_len > model.max_seq_len:
        model = dataclasses.replace(model, max_seq_len=seq_len)
    overrides = {
        "model": model, "seq_len": seq_len, "steps": args.steps, "batch_size": args.batch_size,
        "warmup_steps": args.warmup_steps, "corpus": args.corpus, "sharpness_every": args.sharpness_every,
        "time_limit_s": args.time_limit, "device": args.device,
    }
    setup = dataclasses.replace(setup, **{k: v for k, v in overrides.items() if v is not None})
    if args.rho is not None:
        setup = dataclasses.replace(setup, sharpness=dataclasses.replace(setup.sharpness, rho=args.rho))
    if args.eps == 0:
        setup = dataclasses.replace(setup, epsilon_sharpness=None)
    elif args.eps is not None:
        epsilon = dataclasses.replace(setup.epsilon_sharpness or EpsilonSharpnessConfig(), eps=args.eps)
        setup = dataclasses.replace(setup, epsilon_sharpness=epsilon)
    baseline = spec.baseline if args.baseline is None else (None if args.baseline == "none" else args.baseline)
    return SweepSpec(
        precisions=args.precisions or spec.precisions,
        learning_rates=args.lrs or spec.learning_rates,
        seeds=args.seeds or spec.seeds,
        setup=setup,
        baseline=baseline,
        baseline_nats=spec.baseline_nats if args.baseline_nats is None else args.baseline_nats,
    )


def write_outputs(out: Path, spec, records: list[dict[str, Any]], context: dict[str, Any]) -> dict[str, Any]:
    """summary.json, report.md, heatmap.png, sharpness.png and epsilon-sharpness.png in `out` (the pictures
    where there is something to draw); returns the summary."""
    from ..plots import plot_sweep_heatmaps, plot_sweep_sharpness
    from .analysis import summarize
    from .figures import plot_epsilon_sharpness
    from .report import markdown_report
    from .sweep import to_json_data

    summary = summarize(records, spec.baseline, spec.baseline_nats, spec.setup.sharpness_every or None,
                        spec.precisions, spec.learning_rates)
    context = {**context, "spec": spec.to_json()}
    with open(out / "summary.json", "w") as f:
        json.dump(to_json_data({"context": context, **summary}), f, indent=1, allow_nan=False)
    (out / "report.md").write_text(markdown_report(summary, context))
    title = f"{context['title']} ({len(spec.seeds)} seeds, {spec.setup.steps} steps)"
    plot_sweep_heatmaps(summary, out / "heatmap.png", title)
    correlations = summary["sharpness_vs_divergence"]
    ours = {kind: c for kind, c in correlations.items() if kind != "epsilon"}
    if ours:  # the shared picture is of KL/rho^2 kinds; the paper's sharpness has a picture of its own
        plot_sweep_sharpness({**summary, "sharpness_vs_divergence": ours}, out / "sharpness.png", title)
    if "epsilon" in correlations:
        plot_epsilon_sharpness(summary, out / "epsilon-sharpness.png", title)
    return summary


def _sweep_argv() -> list[str]:
    """The options given after "sweep" on this process's command line (for the report)."""
    argv = sys.argv[1:]
    return argv[argv.index("sweep") + 1:] if "sweep" in argv else argv


def run_sweep_command(args: argparse.Namespace) -> int:
    from .report import machine_info
    from .sweep import load_records, run_sweep

    spec = spec_from_args(args)
    out = Path(args.out or f"runs/sweep-{args.preset}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if args.report_only:
        keys = {c.key() for c in spec.cells()}
        records = [r for r in load_records(out) if r["key"] in keys]
        ran, reused, errors = [], [r["key"] for r in records], {}
    else:
        outcome = run_sweep(spec, out, workers=args.workers, torch_threads=args.threads, progress=not args.no_progress)
        records, ran, reused, errors = outcome.records, outcome.ran, outcome.reused, outcome.errors
    context = {
        "title": f"Stability sweep '{args.preset}'",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": args.command_line or "snip sweep " + " ".join(shlex.quote(a) for a in _sweep_argv()),
        "machine": machine_info(spec.setup.device),
        "wall_s": time.perf_counter() - t0,
        "cell_s": sum(r["time_s"] for r in records),
        "threads": sorted({r["torch_threads"] for r in records}),
        "ran": len(ran),
        "reused": len(reused),
    }
    summary = write_outputs(out, spec, records, context)
    for p in summary["precisions"]:
        row = summary["table"][p]
        cells = "  ".join(f"{lr:g}:{row['by_lr'][repr(lr)]['diverged']}/{row['by_lr'][repr(lr)]['n']}"
                          for lr in summary["learning_rates"])
        print(f"{p:>14}  diverged/runs by lr  {cells}")
    print(f"{len(records)}/{len(spec.cells())} cells ({len(ran)} trained now, {len(reused)} reused) -> "
          f"{out}/report.md, heatmap.png, summary.json")
    for key, tb in errors.items():
        print(f"cell {key} failed:\n{tb}", file=sys.stderr)
    return 1 if errors else 0

