"""What the GPU kernel benchmarks share: their command line's timing options, the device and timer a
run uses (a CUDA GPU, or the CPU for a smoke run), and where they leave their evidence,
bench/results/<device>-<what>.json, the device name slugged ("NVIDIA H100 80GB HBM3" ->
"nvidia-h100-80gb-hbm3")."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Callable

import torch

RESULTS = Path(__file__).resolve().parent / "results"
SMOKE_DEVICE = "cpu (smoke run)"


def add_timing_options(p: argparse.ArgumentParser, what: str, warmup: int = 10, iters: int = 50) -> None:
    """--warmup, --iters, --out, --smoke and --tune on `p`."""
    p.add_argument("--warmup", type=int, default=warmup)
    p.add_argument("--iters", type=int, default=iters)
    p.add_argument("--tune", action="store_true",
                   help="time the FP8 GEMM configurations of each shape on first use and keep the fastest "
                        "(snip_ops.autotune 'tune', its disk cache); default: the committed per-GPU table")
    p.add_argument("--out", type=Path, default=None, help=f"JSON path (default bench/results/<device>-{what}.json)")
    p.add_argument("--smoke", action="store_true",
                   help="a seconds-long run on the CPU (tiny shapes, one call each, host clock, the kernels' CPU "
                        "implementations): checks the benchmark's code without a GPU and measures nothing; needs --out")


def timing_parser(doc: str, what: str) -> argparse.ArgumentParser:
    """A parser with the timing options; the benchmark adds its own."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    add_timing_options(p, what)
    return p


def device_and_timer(args, what: str) -> tuple[torch.device, str, Callable[[Callable], float]]:
    """(device, its name, seconds(fn)): the CUDA GPU with CudaTimer, or under --smoke the CPU with one
    host-clocked call. Exits when neither applies, or when a smoke run would write into bench/results."""
    if args.smoke:
        if args.out is None:
            sys.exit(f"{what}: --smoke needs --out (its numbers are not evidence)")
        return torch.device("cpu"), SMOKE_DEVICE, host_seconds
    if not torch.cuda.is_available():
        sys.exit(f"{what}: needs a CUDA GPU (--smoke runs its code on the CPU)")
    from snip_train.cuda_timer import CudaTimer

    return torch.device("cuda"), torch.cuda.get_device_name(), CudaTimer(args.warmup, args.iters)


def apply_tuning(args) -> str:
    """Set snip_ops.autotune's mode from --tune for this process; returns the mode (results record it)."""
    from snip_ops import autotune

    mode = "tune" if args.tune else "table"
    autotune.configure(autotune.TuningConfig(mode=mode))
    return mode


def host_seconds(fn: Callable) -> float:
    """One call of fn, timed with the host clock (smoke runs: checks that fn runs, not how fast)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def write_device_result(result: dict, what: str, path: Path | None = None) -> Path:
    """Write `result` (which names its "device") as indented JSON; returns the path written."""
    slug = re.sub(r"[^a-z0-9]+", "-", result["device"].lower()).strip("-")
    path = path or RESULTS / f"{slug}-{what}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path
