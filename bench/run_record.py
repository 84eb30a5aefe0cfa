"""What the benchmarks that record their runs share: the provenance stored with each result (when, at
which commit, by which command, on what machine and under what load it ran), and the result written
as <name>.json next to its Markdown summary <name>.md."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def provenance(command: str) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = None
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit,
            "command": command, "platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
            "loadavg_at_start": os.getloadavg()}


def write_result(name: str, result: dict, md: str, results: Path = RESULTS) -> None:
    """Writes `result` and its summary `md` into `results`, and prints the summary."""
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (results / f"{name}.md").write_text(md)
    print(md)
    print(f"wrote {results / name}.json/.md")
