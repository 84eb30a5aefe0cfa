"""What the benchmarks that record their runs share: the provenance stored with each result (when, at
which commit, by which command, on what machine and under what load it ran), and the result written
as <name>.json next to its Markdown summary <name>.md."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from snip_train.source_commit import git_commit

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def command_line() -> str:
    """This process's command line as it reproduces the result: `python -m <module> <arguments>`, without the
    --results directory (where the files went is not how they were made)."""
    argv = list(sys.argv[1:])
    if "--results" in argv:
        del argv[argv.index("--results"):argv.index("--results") + 2]
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    program = f"python -m {spec.name}" if spec is not None else f"python {Path(sys.argv[0]).name}"
    return " ".join([program, *argv])


def machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
            "torch": torch.__version__, "threads": torch.get_num_threads(),
            "loadavg_at_start": os.getloadavg() if hasattr(os, "getloadavg") else None}


def run_provenance() -> dict:
    """When, by which command (`command_line`), at which commit and on what machine a result is made: the
    planner's cost bench and the studies of experiments/ record this."""
    return {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "command": command_line(), "commit": git_commit(),
            "machine": machine()}


def provenance(command: str) -> dict:
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": git_commit(),
            "command": command, "platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "loadavg_at_start": os.getloadavg()}


def write_result(name: str, result: dict, md: str, results: Path = RESULTS) -> None:
    """Writes `result` and its summary `md` into `results`, and prints the summary."""
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (results / f"{name}.md").write_text(md)
    print(md)
    print(f"wrote {results / name}.json/.md")
