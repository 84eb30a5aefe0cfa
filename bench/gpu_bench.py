"""What the GPU kernel benchmarks share: their command line's timing options, and where they leave
their evidence, bench/results/<device>-<what>.json, the device name slugged ("NVIDIA H100 80GB HBM3"
-> "nvidia-h100-80gb-hbm3")."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def timing_parser(doc: str, what: str) -> argparse.ArgumentParser:
    """A parser with --warmup, --iters and --out; the benchmark adds its own options."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--out", type=Path, default=None, help=f"JSON path (default bench/results/<device>-{what}.json)")
    return p


def write_device_result(result: dict, what: str, path: Path | None = None) -> Path:
    """Write `result` (which names its "device") as indented JSON; returns the path written."""
    slug = re.sub(r"[^a-z0-9]+", "-", result["device"].lower()).strip("-")
    path = path or RESULTS / f"{slug}-{what}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path
