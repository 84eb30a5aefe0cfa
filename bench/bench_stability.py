"""Stability benchmark: the bit-reduction sweep on the small model, committed under bench/results/.

    python -m bench.bench_stability                 # preset "cpu": E8M7..E8M2, E5M2, E4M3 vs FP32
    python -m bench.bench_stability --preset cpu-paper --workers 1 --threads 1   # the paper's method
    python -m bench.bench_stability --preset gpu --device cuda --workers 4
    python -m bench.bench_stability --notes notes.md   # append the reader's interpretation to the .md

Cells are kept in runs/bench-stability-<preset>/ (resumable: an interrupted benchmark continues where
it stopped). Results: bench/results/<device>-stability[-<variant>]-<date>.json (summary with every
cell's verdict, final loss, spikes and early sharpness, plus context: date, command, machine, grid), .md
(tables), -cells.json (the raw cell records: per-step training loss, sharpness over time; the shared
setup is in the summary), -heatmap.png, -sharpness.png and, where the paper's sharpness was measured,
-epsilon-sharpness.png. The variant is the preset's name after its device ("cpu-paper" -> "paper");
the presets "cpu" and "gpu" have none.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import sys
from pathlib import Path

from snip_train.stability.command import add_sweep_arguments, run_sweep_command, spec_from_args
from snip_train.stability.sweep import load_records

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sweep_arguments(parser)
    parser.add_argument("--notes", help="Markdown file appended to the report (interpretation, caveats)")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results",
                        help="where the results go (default: bench/results)")
    parser.set_defaults(preset="cpu")
    argv = sys.argv[1:]
    args = parser.parse_args(argv)
    # The recorded command is what reproduces the numbers; the notes file does not affect them.
    shown = [a for i, a in enumerate(argv) if a not in ("--notes", "--results")
             and (i == 0 or argv[i - 1] not in ("--notes", "--results"))]
    args.command_line = " ".join(["python -m bench.bench_stability", *shown])
    args.out = args.out or str(ROOT / "runs" / f"bench-stability-{args.preset}")
    status = run_sweep_command(args)

    device = "gpu" if (args.device or "").startswith("cuda") or args.preset.startswith("gpu") else "cpu"
    variant = args.preset.split("-", 1)[1] if "-" in args.preset else ""
    stem = args.results / "-".join(filter(None, (device, "stability", variant, datetime.date.today().isoformat())))
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    shutil.copyfile(out / "summary.json", stem.with_suffix(".json"))
    keys = {c.key() for c in spec_from_args(args).cells()}
    cells = [{**r, "cell": {k: v for k, v in r["cell"].items() if k != "setup"}} for r in load_records(out) if r["key"] in keys]
    with open(f"{stem}-cells.json", "w") as f:
        json.dump(cells, f, separators=(",", ":"), allow_nan=False)
    report = (out / "report.md").read_text()
    if args.notes:
        report += "\n" + Path(args.notes).read_text()
    stem.with_suffix(".md").write_text(report)
    shutil.copyfile(out / "heatmap.png", f"{stem}-heatmap.png")
    pictures = ["heatmap"]
    for picture in ("sharpness", "epsilon-sharpness"):
        if (out / f"{picture}.png").exists():
            shutil.copyfile(out / f"{picture}.png", f"{stem}-{picture}.png")
            pictures.append(picture)
    print(f"results: {stem}.json / .md / -cells.json / " + " / ".join(f"-{p}.png" for p in pictures))
    return status


if __name__ == "__main__":
    sys.exit(main())
