"""Host-overhead benchmark: the host time of one forward + backward of a `SnipLinear`, against `nn.Linear`,
on a layer so small that the device's work is negligible, side by side in one process.

    python -m bench.bench_host                     # a CUDA GPU if there is one, else the CPU:
                                                   # writes bench/results/<device>-host.json
    python -m bench.bench_host --sm90-host-path    # the CPU: the host work of the H100/H200 path, see below;
                                                   # writes bench/results/cpu-sm90-host-path-host.json
    python -m bench.bench_host --smoke --out X     # seconds: the code runs, nothing is measured

Why: a GPU only runs ahead of Python while the host issues each layer's work faster than the device
completes it. A SnipLinear call does more on the host than nn.Linear's (two custom ops under an
autograd function, the quantizations, the GEMM path and tile choice); where that exceeds the layer's
GPU time -- small layers, short sequences -- the step is bound by the host, whatever the kernels do.
This measures that cost alone.

What is timed: `y = layer(x); y.backward(dy)`, gradients reset to None, `--calls` times in a row, the
device synchronized before and after; the time per call is the median over `--repeats` such runs, the
variants taking turns. For each SnipLinear also its two custom ops alone (`ops_us_per_call`):
snip::linear_fwd, then snip::linear_bwd on what it saved, called as a compiled graph calls them, without
the module and the autograd function around them. torch.compile removes those, not the ops' own Python,
so this is the host work per layer that a compiled step keeps.
On a GPU the kernels of a 16 x 128 x 128 layer finish faster than they are issued, so the time is the
host's. On the CPU it also holds the kernels' CPU implementations of that tiny layer (the quantizer's
host loops, an FP32 GEMM); one intra-op thread. Each entry gives its ratio to nn.Linear's time in the
same run.

`--sm90-host-path` (the CPU, where no GPU is lent): the layer takes the path it takes on an H100 or
H200 -- its GEMMs go through qgemm's path choice (sm90_fp8, sm90_fp4), operand preparation and tile
choice (the committed H200 table), its operands are quantized in the Hopper scale layout -- but on the
CPU: the quantizations run their CPU implementations, and each GEMM launch returns an uninitialised
output of its shape instead of computing. The time is then the host's work on that path plus the
CPU kernels' arithmetic (the quantizer, the FP4 operands' re-encoding), which each entry gives apart
(`cpu_kernels_us_per_call`) and subtracts (`host_us_per_call`). No nn.Linear baseline there: its CPU
matmul is not host work. Only precisions whose GEMMs all have an sm_90 kernel path are timed
(nvfp4_train's are Blackwell's).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from bench.bench_linear import fwd_bwd
from bench.gpu_bench import write_device_result
from bench.run_record import provenance
from snip_ops import LinearPrecision, SnipLinear, _ext, autotune
from snip_ops import gemm_kernels as gk
from snip_ops.reference import QTensor

TOKENS, IN_FEATURES, OUT_FEATURES = 16, 128, 128
PRECISIONS = {
    "snip_fp8": LinearPrecision("fp8"),
    "snip_fp4": LinearPrecision("fp4"),
    "snip_nvfp4_train": LinearPrecision("nvfp4_train"),
    "snip_fp8_fwd_fp4_bwd": LinearPrecision(fprop="fp8", dgrad="fp4", wgrad="fp4"),
}

SM90_GEMM_KERNELS = ("fp8_gemm_nt_blockwise", "fp8_gemm_nt_blockwise_e5m2")
SM90_DEVICE = "NVIDIA H200"  # the device whose committed tuning table the tile choice reads


class _StubbedGemmOps:
    """torch.ops.snip_C with the sm_90 FP8 GEMM launches replaced by an uninitialised output of their shape,
    and the time spent in every other op (the CPU implementations of the quantizer and the FP4 operands'
    re-encoding) added up in `kernel_seconds`."""

    def __init__(self, ops):
        self._ops = ops
        self.kernel_seconds = 0.0

    def __getattr__(self, name):
        if name == "fp8_gemm_nt_blockwise":
            return lambda a, sfa, b, sfb, b_block, out_dtype, bias, config: a.new_empty(a.shape[0], b.shape[0],
                                                                                      dtype=out_dtype)
        if name == "fp8_gemm_nt_blockwise_acc":
            return lambda a, sfa, b, sfb, b_block, out, config: None
        op = getattr(self._ops, name)

        def timed(*args):
            start = time.perf_counter()
            try:
                return op(*args)
            finally:
                self.kernel_seconds += time.perf_counter() - start

        return timed


@contextlib.contextmanager
def sm90_host_path():
    """On the CPU, the layer's sm_90 path with its GEMM launches stubbed (see the module's docstring); yields
    the stubbed op namespace, whose `kernel_seconds` counts the CPU kernels' time."""
    linear_mod = importlib.import_module("snip_ops.linear")  # the package's `linear` is the function
    real_available, real_gemm = _ext.kernel_available, linear_mod._gemm

    def gemm(a, b, out_dtype, out=None):  # linear._gemm sends QTensors to qgemm on CUDA tensors only
        if isinstance(a, QTensor) and isinstance(b, QTensor):
            return gk.qgemm(a, b, out_dtype=out_dtype, out=out)
        return real_gemm(a, b, out_dtype, out)

    ops = _StubbedGemmOps(torch.ops.snip_C)

    def available(name, device):
        return name in SM90_GEMM_KERNELS or real_available(name, device)

    patches = [(gk, "device_arch", lambda device: (9, 0)),
               (_ext, "kernel_available", available),
               (autotune, "device_name", lambda device: SM90_DEVICE),
               (torch.ops, "snip_C", ops),
               (linear_mod, "_gemm", gemm)]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        _ext.gate_changed()  # which kernels may run has changed: no decision kept before holds here
        yield ops
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
        _ext.gate_changed()  # nor one kept here, afterwards


def sm90_paths(precision: LinearPrecision) -> dict[str, str]:
    """{GEMM: the path qgemm takes on an sm_90 GPU with every snip kernel}."""
    return {g: gk.gemm_path(precision.gemm(g), g, (9, 0), lambda kernel: True).path
            for g in ("fprop", "dgrad", "wgrad")}


def ops_fwd_bwd(mod: SnipLinear, x: torch.Tensor, dy: torch.Tensor):
    """A call that runs `mod`'s two custom ops as a compiled step does: linear_fwd, then linear_bwd on the operands
    it saved (the module and the autograd function around them left out); it returns [dx, dw]."""
    linear_mod = importlib.import_module("snip_ops.linear")  # the package's `linear` is the function
    p, x2, w = mod.precision, x.detach(), mod.weight.detach()
    keys = (p.fprop.key(), p.dgrad.key(), p.wgrad.key())
    offset = torch.zeros((), dtype=torch.int64)
    kernels = linear_mod._kernel_mode(x2, mod.emulate)
    n_xt = 0 if p.wgrad.is_bf16 else linear_mod._n_saved(p.wgrad.act, kernels)
    x_keep, w_keep = (x2 if p.wgrad.is_bf16 else None), (w if p.dgrad.is_bf16 else None)
    ops = torch.ops.snip

    def call():
        with torch.no_grad():
            _, *saved = ops.linear_fwd(x2, w, *keys, mod.sr_seed, offset, mod.emulate, True, True)
            return ops.linear_bwd(dy, x_keep, saved[:n_xt], w_keep, saved[n_xt:], x2.shape[1], keys[1], keys[2],
                                  mod.sr_seed, offset, mod.emulate, True, True)

    return call


def mean_host_seconds(call, calls: int, sync) -> float:
    """Mean host time of `call` over `calls` calls in a row, the device synchronized around them."""
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    sync()
    return (time.perf_counter() - start) / calls


def run(args) -> dict:
    if args.smoke and args.out is None:
        sys.exit("bench_host: --smoke needs --out (its numbers are not evidence)")
    stubbed = args.sm90_host_path
    dev = torch.device("cuda" if torch.cuda.is_available() and not (args.smoke or stubbed) else "cpu")
    if dev.type == "cpu":
        torch.set_num_threads(1)
    calls, repeats = (2, 1) if args.smoke else (args.calls, args.repeats)
    gen = torch.Generator(device=dev).manual_seed(0)
    dtype = torch.bfloat16
    lin = nn.Linear(IN_FEATURES, OUT_FEATURES, bias=False, device=dev, dtype=dtype)
    x = torch.randn(TOKENS, IN_FEATURES, device=dev, dtype=dtype, generator=gen).requires_grad_()
    dy = torch.randn(TOKENS, OUT_FEATURES, device=dev, dtype=dtype, generator=gen)
    mods, skipped = {} if stubbed else {"bf16": (lin, {"impl": "nn.Linear (BF16)"})}, []
    for name, precision in PRECISIONS.items():
        desc = {"impl": f"SnipLinear {precision}"}
        if stubbed:
            desc["paths"] = sm90_paths(precision)
            if not all(p in ("sm90_fp8", "sm90_fp4") for p in desc["paths"].values()):
                skipped.append({"variant": name, "reason": f"not all GEMMs on an sm_90 kernel: {desc['paths']}"})
                continue
        mods[name] = (SnipLinear.from_linear(lin, precision, seed=1, name=name), desc)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    fns = {(name, "layer"): fwd_bwd(mod, x, dy) for name, (mod, _) in mods.items()}
    fns.update({(name, "ops"): ops_fwd_bwd(mod, x, dy) for name, (mod, _) in mods.items() if name != "bf16"})
    runs = {key: [] for key in fns}
    kernel = {key: [] for key in fns}
    # unstubbed, no CPU kernel time is set apart
    with sm90_host_path() if stubbed else contextlib.nullcontext(SimpleNamespace(kernel_seconds=0.0)) as ops:
        for fn in fns.values():  # warm-up: a precision's first calls run its kernels' self-checks
            mean_host_seconds(fn, min(calls, 10), sync)
        for _ in range(repeats):  # the variants take turns, so that a drift of the machine hits them alike
            for key, fn in fns.items():
                before = ops.kernel_seconds
                runs[key].append(mean_host_seconds(fn, calls, sync))
                kernel[key].append((ops.kernel_seconds - before) / calls)
    entries = []
    for name, (_, desc) in mods.items():
        e = {"variant": name, **desc}
        for what, prefix in (("layer", ""), ("ops", "ops_")):
            if (name, what) not in runs:
                continue
            t, k = runs[name, what], kernel[name, what]
            e[f"{prefix}us_per_call"] = statistics.median(t) * 1e6
            e[f"{prefix}us_per_call_runs"] = [v * 1e6 for v in t]
            if stubbed:  # the CPU kernels' share, and the rest: the host work a GPU run would have
                e[f"{prefix}cpu_kernels_us_per_call"] = statistics.median(k) * 1e6
                e[f"{prefix}host_us_per_call"] = statistics.median(a - b for a, b in zip(t, k)) * 1e6
        entries.append(e)
    base = None if stubbed else entries[0]["us_per_call"]
    for e in entries:
        if base is not None:
            e["ratio_to_bf16"] = e["us_per_call"] / base
        tail = (f"x{e['ratio_to_bf16']:.2f} nn.Linear's" if base is not None else
                f"host {e['host_us_per_call']:.1f} us + CPU kernels {e['cpu_kernels_us_per_call']:.1f} us")
        if "ops_us_per_call" in e:
            ops = e["ops_host_us_per_call"] if stubbed else e["ops_us_per_call"]
            tail += f"; its ops alone {ops:.1f} us{' host' if stubbed else ''}"
        print(f"  {e['variant']:>22} {e['us_per_call']:9.1f} us per forward + backward   {tail}", flush=True)
    device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    if stubbed:
        device = "cpu sm90-host-path"
    return {
        **provenance(" ".join(["python -m bench.bench_host", *sys.argv[1:]])),
        "device": "cpu (smoke run)" if args.smoke else device, "threads": torch.get_num_threads(),
        "build": _ext.build_info().get("built_with"),
        "quantizer": "snip_C::quantize" if _ext.kernel_available("quantize", dev) else "emulated (reference)",
        "shape": {"tokens": TOKENS, "in_features": IN_FEATURES, "out_features": OUT_FEATURES, "dtype": "bfloat16"},
        "method": (f"host clock, device synchronized around {calls} calls, median of {repeats} runs taken in turns; "
                   "ops_*: the layer's two custom ops alone, as a compiled step calls them"
                   + ("; sm_90 path on the CPU, GEMM launches stubbed" if stubbed else "")),
        "entries": entries, "skipped": skipped,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, default=None, help="JSON path (default bench/results/<device>-host.json)")
    p.add_argument("--smoke", action="store_true", help="two calls on the CPU: checks the code, measures nothing")
    p.add_argument("--sm90-host-path", action="store_true",
                   help="on the CPU, the host work of the H100/H200 path, GEMM launches stubbed (see above)")
    args = p.parse_args()
    result = run(args)
    print(f"\nwrote {write_device_result(result, 'host', args.out)}")


if __name__ == "__main__":
    main()
