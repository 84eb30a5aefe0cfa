"""Where a GPU benchmark leaves its evidence: bench/results/<device>-<what>.json, the device name
slugged ("NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3")."""

from __future__ import annotations

import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write_device_result(result: dict, what: str, path: Path | None = None) -> Path:
    """Write `result` (which names its "device") as indented JSON; returns the path written."""
    slug = re.sub(r"[^a-z0-9]+", "-", result["device"].lower()).strip("-")
    path = path or RESULTS / f"{slug}-{what}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path
