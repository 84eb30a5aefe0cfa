"""Per-shape tile configurations for the Hopper FP8 block-scaled GEMM (snip_C::fp8_gemm_nt_blockwise).

`gemm_kernels.qgemm(..., config="")` asks `choose` which config string ("tile=64x128,raster=n,swizzle=2",
csrc/gemm/fp8_gemm_heuristic.h) to pass the kernel; an explicit `config` is passed as given. What
`choose` does is set process-wide by a frozen `TuningConfig`:

    from snip_ops import autotune
    autotune.configure(autotune.TuningConfig(mode="tune"))                        # measure, keep on disk
    autotune.configure(autotune.TuningConfig(mode="tune", cache_path="tune.json"))  # another cache file
    autotune.configure(autotune.TuningConfig(mode="off"))                         # the C++ heuristic only

Modes:
  "table" (default)  the committed table snip_ops/gemm_tuning/<device slug>.json, made by `write_table`
                     from a bench_gemm --configs result (bench/results/<device>-gemm-configs.json): the
                     fastest measured candidate per GEMM kind and (m, n, k). A call takes the entry of its
                     kind (kernel, b_block, output dtype; accumulating or not alike: the mainloop is the
                     same) whose m and n are each within a factor of two of the call's (m bucketed as
                     below) -- the grid's shape decides which tile and tile order win -- nearest in
                     |log2 m/m'| + |log2 n/n'| + |log2 k/k'|, ties to the earlier entry; none such, or no
                     table for this device: "" (the heuristic). A kind the table has no entry of takes the
                     entries of the same kernel and B blocks with the other output dtype (the same mainloop
                     and tiles; only the epilogue's stores differ): the table times wgrad with FP32 output,
                     and a layer with BF16 weights runs it with BF16 output.
  "tune"             the first GEMM of each key times every candidate on its own operands (`tune`) and
                     keeps the fastest, in memory and in a JSON cache (`cache_path`, default
                     $XDG_CACHE_HOME/snip/autotune-<device slug>.json, else ~/.cache/snip/...); later
                     processes read it back. Not while a CUDA graph is captured or torch.compile traces:
                     those calls use the table until an eager call has tuned the key.
  "off"              always "" (the C++ heuristic).
"table" is the default until the tuner has run on a GPU (tests/ops/test_autotune.py's gpu test).

Key (`TuningKey`): device name, snip version (an entry of another device or version is never read), the
GEMM kind (`GemmKind`: kernel, B's block rows, the output dtype the kernel writes, in-place accumulation
or not), M rounded up to a power of two (token counts that vary reuse one choice), N and K as the kernel
sees them (padded).

A candidate is kept only if it runs and its output is bit-identical to the heuristic's on the same
operands: every config of one kind computes each output element with the same arithmetic -- its K
blocks in the same order, each block's wgmma sum promoted by the same FFMA -- whichever tile, order or
mainloop (CUTLASS's, or the one that overlaps the promotion with the next block's wgmmas) computes it,
and the persistent scheduler never splits K, so a different bit is a kernel bug, reported by a
RuntimeWarning, never a rounding difference to tolerate. `bench_gemm --configs`, whose results the
committed table is made from, applies the same test.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import os
import re
import statistics
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

__all__ = ["MODES", "GemmKind", "TuningKey", "TuningConfig", "Tuned", "configure", "current", "candidates",
           "key_for", "choose", "settled", "tune", "same_bits", "table_lookup", "table_from_bench", "write_table", "default_cache_path",
           "cuda_event_timer", "device_slug", "device_name", "SNIP_VERSION"]

MODES = ("off", "table", "tune")
TABLE_DIR = Path(__file__).parent / "gemm_tuning"
_CACHE_FORMAT = 1

Runner = Callable[[str], torch.Tensor]  # config string -> the GEMM's output (a new tensor)
Timer = Callable[[Callable[[], object]], float]  # a call -> its time in milliseconds


def _snip_version() -> str:
    try:
        return importlib.metadata.version("snip")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


SNIP_VERSION = _snip_version()


@dataclass(frozen=True)
class GemmKind:
    kernel: str        # the snip_ops._ext kernel name: fp8_gemm_nt_blockwise[_e5m2][_sm100]
    b_block: int       # 128: B scales per 128x128 block, 1: per 1x128 row block
    out_dtype: str     # what the kernel writes: "bfloat16" or "float32"
    accumulate: bool   # in place into `out` (snip_C::fp8_gemm_nt_blockwise_acc)


@dataclass(frozen=True)
class TuningKey:
    device: str
    version: str
    kind: GemmKind
    m_bucket: int
    n: int
    k: int

    def text(self) -> str:
        k = self.kind
        return (f"{self.device}|{self.version}|{k.kernel}|b{k.b_block}|{k.out_dtype}|"
                f"{'acc' if k.accumulate else 'new'}|m{self.m_bucket}|n{self.n}|k{self.k}")


def key_for(device_name: str, kind: GemmKind, m: int, n: int, k: int, version: str = SNIP_VERSION) -> TuningKey:
    """The key of an [m, k] x [n, k]^T GEMM of `kind` on the device named `device_name`."""
    return TuningKey(device_name, version, kind, 1 << max(m - 1, 0).bit_length(), n, k)


@dataclass(frozen=True)
class TuningConfig:
    mode: str = "table"
    cache_path: str | os.PathLike | None = None  # "tune": the JSON cache; None: default_cache_path(device)
    timer: Timer | None = None                   # "tune": None is cuda_event_timer()

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"TuningConfig: mode must be one of {MODES}, got {self.mode!r}")


_current = TuningConfig()
_chosen: dict[tuple[TuningConfig, str], str] = {}  # (config, key text) -> choice, this process


def configure(tuning: TuningConfig) -> TuningConfig:
    """Set how qgemm picks FP8 GEMM configs from now on in this process; returns the previous setting."""
    global _current
    if not isinstance(tuning, TuningConfig):
        raise TypeError(f"configure takes a TuningConfig, got {type(tuning).__name__}")
    previous, _current = _current, tuning
    return previous


def current() -> TuningConfig:
    return _current


# The compiled sm_90a configurations per kind (csrc/gemm/fp8_gemm_nt_blockwise_op.cpp, kVariants) besides
# the 128x128 cooperative tile with CUTLASS's mainloop, which every kind has: the overlapped-promotion
# mainloop (csrc/gemm/sm90/overlapped_promotion_mainloop.cuh) for the kinds of a linear layer's GEMMs
# (128x128-blocked B with BF16 out, 1x128 with FP32 out, E4M3 or E5M2 A), and for E4M3 x 128x128 blocks
# with BF16 output also that mainloop with a 2x1 cluster (B multicast) and the ping-pong 64x128 tile; and
# the 128x192 tile (csrc/gemm/sm90/wide_tile_mainloop.cuh) for E4M3: B in 128x128 blocks with BF16 output,
# in 1x128 blocks (wgrad) with BF16 or FP32 output.
_OVERLAPPED = "tile=128x128,promotion=overlapped"
_OVERLAPPED_KINDS = (("fp8_gemm_nt_blockwise", 128, "bfloat16"), ("fp8_gemm_nt_blockwise", 1, "float32"),
                     ("fp8_gemm_nt_blockwise_e5m2", 128, "bfloat16"), ("fp8_gemm_nt_blockwise_e5m2", 1, "float32"))


def candidates(kind: GemmKind) -> tuple[str, ...]:
    """The configs worth timing for `kind`, "" (the heuristic) first. CUTLASS's 128x128 tile and the
    overlapped mainloop each as they are and rastered along M and along N -- the orders that decide how
    operands are reused in L2 -- and CUTLASS's 128x128 with swizzle 2, which groups the tiles of big grids;
    the 2x1-cluster variant as it is and rastered along M (its cluster already shares B along M); the
    64x128 tile as it is: it wins only grids under about a wave, where order matters little
    (bench/results/nvidia-h200-gemm-configs.json has both tiles under each order); the 128x192 tile as it
    is and rastered along M and along N (each of the three is the fastest config somewhere in that file). At
    most fourteen, so a key tunes in a few hundred GEMMs. The sm_100 kernels have one tile configuration each: the tile
    scheduler's order and swizzle, which are arguments, not instantiations."""
    if kind.kernel.endswith("_sm100"):
        return ("", "raster=m", "raster=n", "swizzle=2")
    out = ["", "tile=128x128", "tile=128x128,raster=m", "tile=128x128,raster=n", "tile=128x128,swizzle=2"]
    if (kind.kernel, kind.b_block, kind.out_dtype) in _OVERLAPPED_KINDS:
        out += [_OVERLAPPED, f"{_OVERLAPPED},raster=m", f"{_OVERLAPPED},raster=n"]
    if (kind.kernel, kind.b_block, kind.out_dtype) == ("fp8_gemm_nt_blockwise", 128, "bfloat16"):
        out += [f"{_OVERLAPPED},cluster=2x1", f"{_OVERLAPPED},cluster=2x1,raster=m", "tile=64x128"]
    if kind.kernel == "fp8_gemm_nt_blockwise" and (kind.out_dtype == "bfloat16" or kind.b_block == 1):
        out += ["tile=128x192", "tile=128x192,raster=m", "tile=128x192,raster=n"]
    return tuple(out)


# ---- measuring -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tuned:
    config: str
    ms: dict[str, float]      # candidate -> its time
    skipped: dict[str, str]   # candidate -> why it was not timed


def cuda_event_timer(warmup: int = 3, reps: int = 10) -> Timer:
    """A Timer: `warmup` calls, then the median of `reps` calls each timed by CUDA events on the current
    stream (in place, caches warm: the conditions the GEMM runs under in training)."""
    def timer(fn: Callable[[], object]) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)
    return timer


def same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether two outputs are the same tensor bit for bit (dtype, shape and every byte)."""
    return (x.dtype == y.dtype and x.shape == y.shape
            and torch.equal(x.contiguous().reshape(-1).view(torch.uint8), y.contiguous().reshape(-1).view(torch.uint8)))


def tune(key: TuningKey, run: Runner, timer: Timer) -> Tuned:
    """Time each candidate of key.kind with `run(config)` and `timer`; the fastest that runs and matches the
    heuristic's output bit for bit. The heuristic's own failure propagates: the GEMM cannot run at all."""
    reference = run("")
    ms, skipped = {}, {}
    for config in candidates(key.kind):
        try:
            if config and not same_bits(run(config), reference):
                skipped[config] = "output differs from the heuristic's"
                warnings.warn(f"snip_ops.autotune: {key.kind.kernel} with config {config!r} gives another result than "
                              f"its heuristic for {key.text()}; not used. Please report this with "
                              f"snip_ops.build_info().", RuntimeWarning, stacklevel=2)
                continue
            ms[config] = float(timer(lambda c=config: run(c)))
        except Exception as e:  # noqa: BLE001 -- a config the kernel cannot run (can_implement, not compiled)
            skipped[config] = f"{type(e).__name__}: {e}"
    if not ms:
        return Tuned("", ms, skipped)
    return Tuned(min(ms, key=lambda c: (ms[c], c != "")), ms, skipped)  # ties keep the heuristic


# ---- the on-disk cache -----------------------------------------------------------------------------


def device_slug(device_name: str) -> str:
    """"NVIDIA H200" -> "nvidia-h200" (file names of the table and the cache)."""
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower()).strip("-")


def default_cache_path(device_name: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "snip" / f"autotune-{device_slug(device_name)}.json"


def _read_cache(path: Path, warn: bool = True) -> dict:
    """The cache's entries {key text: entry}; {} if there is no file, or (with a warning) an unreadable one."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if not (isinstance(data, dict) and data.get("format") == _CACHE_FORMAT and isinstance(data.get("entries"), dict)):
            raise ValueError(f"not a format-{_CACHE_FORMAT} tuning cache")
        return data["entries"]
    except (OSError, ValueError) as e:
        if warn:
            warnings.warn(f"snip_ops.autotune: ignoring the unreadable tuning cache {path} ({e}); its GEMMs are "
                          f"tuned again and the file rewritten", RuntimeWarning, stacklevel=4)
        return {}


def _cached(path: Path, key: TuningKey) -> str | None:
    entry = _read_cache(path).get(key.text())
    if (isinstance(entry, dict) and entry.get("device") == key.device and entry.get("snip_version") == key.version
            and entry.get("config") in candidates(key.kind)):
        return entry["config"]
    return None


def _store(path: Path, key: TuningKey, tuned: Tuned) -> None:
    """Add the key's entry to the cache (merged with what is there; written whole, then renamed, so that a
    reader never sees half a file)."""
    entries = _read_cache(path, warn=False)
    entries[key.text()] = dict(device=key.device, snip_version=key.version, config=tuned.config, ms=tuned.ms,
                               skipped=tuned.skipped)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dict(format=_CACHE_FORMAT, entries=entries), indent=1, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        warnings.warn(f"snip_ops.autotune: cannot write the tuning cache {path} ({e}); the choice is kept for this "
                      f"process only", RuntimeWarning, stacklevel=3)


# ---- the committed table ---------------------------------------------------------------------------


@lru_cache(maxsize=None)
def _table(device_name: str) -> tuple[dict, ...]:
    path = TABLE_DIR / f"{device_slug(device_name)}.json"
    if not path.exists():
        return ()
    data = json.loads(path.read_text())
    return tuple(data["entries"]) if data.get("device") == device_name else ()


def table_lookup(key: TuningKey) -> str:
    """The committed table's config for `key` (rules in the module docstring); "" where it has none."""
    kind = key.kind
    entries = [e for e in _table(key.device) if (e["kernel"], e["b_block"]) == (kind.kernel, kind.b_block)]
    same_out = [e for e in entries if e["out_dtype"] == kind.out_dtype]
    best, best_distance = "", math.inf
    for e in same_out or entries:
        dm, dn, dk = (abs(math.log2(q / e[d])) for q, d in ((key.m_bucket, "m"), (key.n, "n"), (key.k, "k")))
        if dm <= 1 and dn <= 1 and dm + dn + dk < best_distance and e["config"] in candidates(key.kind):
            best, best_distance = e["config"], dm + dn + dk
    return best


# How bench_gemm (bench/bench_gemm.py) runs each of a layer's GEMMs with --configs: E4M3 operands, B blocks
# and output dtype per GEMM (a config row's own `out_dtype` where it has one), no accumulation; the
# heuristic's times are its "fp8" entries, and for wgrad with BF16 output its "fp8_wgrad_bf16" baselines.
_BENCH_KINDS = {"fprop": GemmKind("fp8_gemm_nt_blockwise", 128, "bfloat16", False),
                "dgrad": GemmKind("fp8_gemm_nt_blockwise", 128, "bfloat16", False),
                "wgrad": GemmKind("fp8_gemm_nt_blockwise", 1, "float32", False)}
_BENCH_HEURISTIC = {"fp8": None, "fp8_wgrad_bf16": "bfloat16"}  # format -> its output dtype (None: the kind's)


def table_from_bench(results: dict, source: str = "") -> dict:
    """The committed table from a bench_gemm --configs result: per GEMM kind and (m, n, k), the candidate
    with the least mean time over the result's rows ("configs", and the heuristic's own "fp8" entries as
    ""). Rows of one kind and shape pool: fprop and dgrad run the same kernel, and a square layer's GEMM
    can also be a Llama layer's."""
    times: dict[tuple, dict[str, list[float]]] = {}
    rows = [(r, r["impl"], r.get("out_dtype")) for r in results.get("configs", [])]
    rows += [(r, "", _BENCH_HEURISTIC[r["format"]]) for r in results.get("entries", []) + results.get("baselines", [])
             if r.get("format") in _BENCH_HEURISTIC]
    for r, config, out_dtype in rows:
        kind = _BENCH_KINDS.get(r["gemm"])
        if kind is not None and out_dtype is not None:
            kind = dataclasses.replace(kind, out_dtype=out_dtype)
        if kind is None or config not in candidates(kind):
            continue
        shape = (kind.kernel, kind.b_block, kind.out_dtype, r["m"], r["n"], r["k"])
        times.setdefault(shape, {}).setdefault(config, []).append(r["ms"])
    entries = []
    for (kernel, b_block, out_dtype, m, n, k), per_config in sorted(times.items()):
        mean = {c: statistics.fmean(v) for c, v in per_config.items()}
        config = min(mean, key=lambda c: (mean[c], c != ""))
        entries.append(dict(kernel=kernel, b_block=b_block, out_dtype=out_dtype, m=m, n=n, k=k, config=config,
                            ms=round(mean[config], 6)))
    return dict(device=results["device"], source=source, commit=results.get("commit"), entries=entries)


def write_table(results_path: str | os.PathLike) -> Path:
    """Write the committed table (TABLE_DIR/<device slug>.json) of the device a bench_gemm --configs result
    was measured on, e.g. write_table("bench/results/nvidia-h200-gemm-configs.json"); returns its path."""
    src = Path(results_path)
    table = table_from_bench(json.loads(src.read_text()), source=src.name)
    out = TABLE_DIR / f"{device_slug(table['device'])}.json"
    out.write_text(json.dumps(table, indent=1) + "\n")
    return out


# ---- the choice ------------------------------------------------------------------------------------


def _no_tuning_now() -> bool:
    """Inside a CUDA graph capture or a trace (torch.compile, make_fx, fake tensors) nothing may be timed
    or synchronized."""
    return (torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None
            or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()))


def choose(key: TuningKey, run: Runner | None = None, tuning: TuningConfig | None = None) -> str:
    """The config string for a GEMM of `key` under `tuning` (default: `current()`); `run(config)` runs this
    GEMM on its operands (needed by "tune" the first time a key is seen)."""
    tuning = current() if tuning is None else tuning
    if tuning.mode == "off" or candidates(key.kind) == ("",):
        return ""
    memo = (tuning, key.text())
    if memo in _chosen:
        return _chosen[memo]
    if tuning.mode == "table" or run is None or _no_tuning_now():
        choice = table_lookup(key)
        if tuning.mode == "table":
            _chosen[memo] = choice
        return choice
    path = Path(tuning.cache_path) if tuning.cache_path is not None else default_cache_path(key.device)
    choice = _cached(path, key)
    if choice is None:
        tuned = tune(key, run, tuning.timer or cuda_event_timer())
        _store(path, key, tuned)
        choice = tuned.config
    _chosen[memo] = choice
    return choice


def settled(key: TuningKey, tuning: TuningConfig | None = None) -> bool:
    """Whether `choose(key)` under `tuning` (default `current()`) gives the config it gave last, from now on
    in this process: "off", a kind with no candidate but the heuristic, or a key it has answered for good
    (not one answered from the table inside a trace while tuning waits for an eager call)."""
    tuning = current() if tuning is None else tuning
    return tuning.mode == "off" or candidates(key.kind) == ("",) or (tuning, key.text()) in _chosen


@lru_cache(maxsize=None)
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def device_name(device: torch.device | str) -> str:
    """A CUDA device's name, as keys and tables name it ("NVIDIA H200"); another device's type ("cpu")."""
    return _device_name(torch.device(device))


