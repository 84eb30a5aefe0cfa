"""The commit of the source tree snip runs from, for the provenance results record."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit() -> str | None:
    """The checked-out commit of the source tree; None outside a git checkout (an installed wheel)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True)
    except OSError:
        return None
    return out.stdout.strip() or None
