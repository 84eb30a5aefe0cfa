"""The sweep runner: seeds x learning rates x precisions, in parallel processes, resumable.

Every finished cell is written to `<out>/cells/<key>.json`, `key` being a hash of the cell's whole
configuration (`Cell.key`); a later run of the same or a larger grid reuses those files and only
trains the missing cells. A cell that raised is reported and not written, so it is retried next time;
a cell stopped by its time limit is retried when the limit has been raised since.

Parallelism: `workers` processes (spawned, so no OpenMP state is inherited from the parent), each with
`torch_threads` intra-op threads; by default as many workers as cores, one thread each, which keeps
the machine exactly busy without oversubscription. One worker runs in the calling process.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import multiprocessing
import os
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .cell import BASELINE, Cell, TrainingSetup, run_cell

__all__ = ["SweepSpec", "SweepOutcome", "run_sweep", "load_records", "to_json_data"]


@dataclass(frozen=True)
class SweepSpec:
    precisions: tuple[str, ...]
    learning_rates: tuple[float, ...]
    seeds: tuple[int, ...]
    setup: TrainingSetup = field(default_factory=TrainingSetup)
    baseline: str | None = BASELINE   # what the offline divergence rule compares against (None: no comparison)
    baseline_nats: float = 0.3        # offline rule: final loss above the baseline's mean at the same LR by this much

    def __post_init__(self):
        for name in ("precisions", "learning_rates", "seeds"):
            values = tuple(getattr(self, name))
            if not values or len(set(values)) != len(values):
                raise ValueError(f"{name} must be non-empty and without repeats, got {values}")
            object.__setattr__(self, name, values)
        if self.baseline is not None and self.baseline not in self.precisions:
            raise ValueError(f"baseline {self.baseline!r} is not among the precisions {self.precisions}")

    def cells(self) -> list[Cell]:
        """Seed-major order, so an interrupted sweep leaves whole seeds finished first."""
        return [Cell(p, lr, s, self.setup) for s in self.seeds for lr in self.learning_rates for p in self.precisions]

    def to_json(self) -> dict[str, Any]:
        return {
            "precisions": list(self.precisions), "learning_rates": list(self.learning_rates),
            "seeds": list(self.seeds), "baseline": self.baseline, "baseline_nats": self.baseline_nats,
            "setup": self.setup.to_json(),
        }


@dataclass(frozen=True)
class SweepOutcome:
    records: list[dict[str, Any]]     # one per cell of the spec that has a result, in spec order
    ran: list[str]                    # keys trained by this call
    reused: list[str]                 # keys found on disk
    errors: dict[str, str]            # key -> traceback of cells that raised (not written)


def to_json_data(obj: Any) -> Any:
    """`obj` as it reads back from JSON (tuples as lists), NaN and Inf as None (JSON has neither)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): to_json_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json_data(v) for v in obj]
    return obj


def _cell_path(out_dir: Path, key: str) -> Path:
    return out_dir / "cells" / f"{key}.json"


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None  # missing or half-written by a killed process: the cell is rerun


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, allow_nan=False)
    os.replace(tmp, path)  # atomic: a reader never sees a partial record


def _finished_record(path: Path, cell: Cell) -> dict[str, Any] | None:
    record = _read_record(path)
    if record is not None and record["status"] == "time_limit":
        if cell.setup.time_limit_s > record["cell"]["setup"]["time_limit_s"]:
            return None
    return record


def load_records(out_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every cell record under `out_dir/cells` (for re-analysis without a spec)."""
    paths = sorted((Path(out_dir) / "cells").glob("*.json"))
    return [r for r in (_read_record(p) for p in paths) if r is not None]


def _init_worker(torch_threads: int) -> None:
    torch.set_num_threads(torch_threads)


def _run_cell_safely(cell: Cell) -> tuple[str, dict[str, Any] | None, str | None]:
    try:
        return cell.key(), run_cell(cell), None
    except Exception:  # noqa: BLE001 -- reported per cell; one failing cell must not sink the sweep
        return cell.key(), None, traceback.format_exc()


def run_sweep(
    spec: SweepSpec,
    out_dir: str | os.PathLike,
    workers: int | None = None,
    torch_threads: int | None = None,
    progress: bool = True,
) -> SweepOutcome:
    """Run the cells of `spec` that have no record under `out_dir` yet; return all records.

    `workers` defaults to min(cores, pending cells); `torch_threads` to cores // workers (on a machine
    shared with other jobs pass 1: oversubscribed intra-op threads slow a run down several-fold).
    """
    from tqdm.auto import tqdm

    out = Path(out_dir)
    (out / "cells").mkdir(parents=True, exist_ok=True)
    _write_json(out / "sweep.json", spec.to_json())
    cells = spec.cells()
    existing = {c.key(): _finished_record(_cell_path(out, c.key()), c) for c in cells}
    reused = [k for k, r in existing.items() if r is not None]
    pending = [c for c in cells if existing[c.key()] is None]
    cores = os.cpu_count() or 1
    workers = max(1, min(workers or cores, cores, len(pending) or 1))
    threads = torch_threads or max(1, cores // workers)
    ran, errors = [], {}
    bar = tqdm(total=len(cells), initial=len(reused), desc="sweep", unit="cell", disable=not progress, dynamic_ncols=True)

    def finish(key: str, record: dict[str, Any] | None, error: str | None) -> None:
        if record is None:
            errors[key] = error
        else:
            record = to_json_data(record)  # the same form a later run reads back from disk
            _write_json(_cell_path(out, key), record)
            existing[key] = record
            ran.append(key)
        bar.update(1)

    if workers == 1:
        previous_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            for cell in pending:
                finish(*_run_cell_safely(cell))
        finally:
            torch.set_num_threads(previous_threads)
    else:
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, context, _init_worker, (threads,)) as pool:
            futures = [pool.submit(_run_cell_safely, cell) for cell in pending]
            for future in concurrent.futures.as_completed(futures):
                finish(*future.result())
    bar.close()
    records = [existing[c.key()] for c in cells if existing[c.key()] is not None]
    return SweepOutcome(records, ran, reused, errors)
