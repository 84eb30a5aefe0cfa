"""What one GEMM of a linear layer costs on this device, its operands' quantization included.

A linear layer y = x w^T (M tokens, K inputs, N outputs) runs three GEMMs (planner/cost.py names them
(m, n, k)): fprop x w^T, dgrad dy w, wgrad dy^T x. In a precision other than bf16 each GEMM quantizes its
two operands from BF16 as the layer does (activations and gradients in rows, the weight in its blocks,
wgrad's dy^T and x^T along the tokens) and multiplies them with `gemm_kernels.qgemm`, whose FP8 kernel
config comes from `snip_ops.autotune` (tuned on this GPU when tuning is on). `measure` times exactly
that -- the quantization passes and the GEMM, each with `timer` -- and returns a table that
`planner.cost.MeasuredCost.from_json` reads, so that a time budget prices what this hardware measured:

    from snip_ops import autotune, gemm_timing
    autotune.configure(autotune.TuningConfig(mode="tune"))
    table = gemm_timing.measure([(8192, 4096, 4096)], ["bf16", "fp8", "fp4"], "cuda")

`snip cost` writes such a table for a model preset's linear layers.

Each GEMM is charged the quantization of both its operands. In a training step some passes serve two
GEMMs (the weight's 128x128-block codes serve fprop and, transposed, dgrad), so a whole layer's measured
cost can exceed what it spends; the planner chooses each GEMM's precision on its own, and this charge is
what the GEMM costs when its partner runs in another precision.
"""

from __future__ import annotations

import statistics
import time
import zlib
from typing import Callable, Iterable

import torch

from snip_ops import autotune, gemm_kernels
from snip_ops.formats import GEMMS, gemm_dims, recipe
from snip_ops.quantize import quantize

__all__ = ["layer_gemm_inputs", "quantize_for_gemm", "OUT_DTYPE", "wall_timer", "measure"]

# What each of a BF16 layer's GEMMs writes: activations and gradients, the weight gradient too (snip_ops.linear
# writes it in the weight's dtype).
OUT_DTYPE = torch.bfloat16

Timer = Callable[[Callable[[], object]], float]  # a call -> its time in milliseconds


def layer_gemm_inputs(gemm: str, m: int, n: int, k: int, device, dtype=torch.bfloat16):
    """Random normal (a, b) sources of the (m, n, k) GEMM as the layer holds them before quantizing:
    fprop (x [m, k], w [n, k]); dgrad (dy [m, k], w [k, n]); wgrad (dy [k, m], x [k, n]), the token
    dimension k first. Seeded by the GEMM and its shape."""
    if gemm not in GEMMS:
        raise ValueError(f"unknown GEMM {gemm!r}; expected one of {GEMMS}")
    g = torch.Generator(device=device).manual_seed(zlib.crc32(f"{gemm}{m},{n},{k}".encode()))
    shapes = {"fprop": ((m, k), (n, k)), "dgrad": ((m, k), (k, n)), "wgrad": ((k, m), (k, n))}[gemm]
    return tuple(torch.randn(*s, device=device, generator=g, dtype=dtype) for s in shapes)


def quantize_for_gemm(gemm: str, precision: str, a_src: torch.Tensor, b_src: torch.Tensor):
    """The quantized (a [m, k], b [n, k]) that `qgemm` receives for `gemm` in `precision`, from the
    sources of `layer_gemm_inputs` (docs/design.md §3), with their scales in the layout the layer
    writes on this device (`gemm_kernels.scale_layout_for`)."""
    r = recipe(precision)
    if None in (r.act, r.weight, r.grad):
        raise ValueError(f"precision {precision!r} does not quantize all three operands of a linear layer")

    def q(src, spec, transpose=False):
        return quantize(src, spec, transpose=transpose, scale_layout=gemm_kernels.scale_layout_for(spec, src.device))
    if gemm == "wgrad":  # a = dy^T, b = x^T, blocks along the token dimension
        return q(a_src, r.grad, True), q(b_src, r.act, True)
    if gemm == "fprop":
        return q(a_src, r.act), q(b_src, r.weight)
    # dgrad: b = w^T of w [k, n], as the layer's fused row + column pass writes it (for square blocks
    # the same codes as w's transposed)
    return q(a_src, r.grad), q(b_src, r.weight, True)


def wall_timer(reps: int = 5, warmup: int = 1) -> Timer:
    """A Timer for devices without events (the CPU): `warmup` calls, then the median wall time of `reps`."""
    def timer(fn: Callable[[], object]) -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    return timer


def _bf16_gemm(gemm: str, a_src: torch.Tensor, b_src: torch.Tensor) -> Callable[[], torch.Tensor]:
    """The layer's own BF16 GEMM (snip_ops.linear): x w^T, dy w, dy^T x."""
    if gemm == "fprop":
        return lambda: a_src @ b_src.t()
    if gemm == "dgrad":
        return lambda: a_src @ b_src
    return lambda: a_src.t() @ b_src


def measure(layers: Iterable[tuple[int, int, int]], precisions: Iterable[str], device,
            timer: Timer | None = None) -> dict:
    """Time every GEMM of each (M, N, K) layer in each precision on `device`: {"device", "unit": "s",
    "tuning", "method", "entries": [{"m", "n", "k", "gemm", "format", "time", "quantize_ms", "gemm_ms",
    "path"}]} (MeasuredCost's table). `time` is quantize_ms + gemm_ms in seconds; bf16 quantizes nothing;
    `path` is qgemm's path (gemm_kernels.PATHS; "bf16" for torch's BF16 GEMM); "tuning" the autotuner's
    mode the FP8 kernels ran under. Default timer: CUDA events on a GPU (autotune.cuda_event_timer),
    else wall time."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    precisions = list(dict.fromkeys(precisions))
    for p in precisions:
        r = recipe(p)
        if not r.is_bf16 and None in (r.act, r.weight, r.grad):
            raise ValueError(f"precision {p!r} does not quantize all three operands of a linear layer")
    events = timer is None and device.type == "cuda"
    timer = timer or (autotune.cuda_event_timer() if events else wall_timer())
    seen, entries = set(), []
    for M, N, K in layers:
        for gemm in GEMMS:
            m, n, k = gemm_dims(gemm, M, N, K)
            if (m, n, k, gemm) in seen:
                continue
            seen.add((m, n, k, gemm))
            a_src, b_src = layer_gemm_inputs(gemm, m, n, k, device)
            for p in precisions:
                row = dict(m=m, n=n, k=k, gemm=gemm, format=p)
                if recipe(p).is_bf16:
                    quant_ms, gemm_ms, path = 0.0, float(timer(_bf16_gemm(gemm, a_src, b_src))), "bf16"
                else:
                    qa, qb = quantize_for_gemm(gemm, p, a_src, b_src)
                    quant_ms = float(timer(lambda: quantize_for_gemm(gemm, p, a_src, b_src)))
                    gemm_ms = float(timer(lambda: gemm_kernels.qgemm(qa, qb, out_dtype=OUT_DTYPE)))
                    path = gemm_kernels.select_path(qa, qb, out_dtype=OUT_DTYPE).path
                    del qa, qb
                entries.append(dict(row, time=(quant_ms + gemm_ms) * 1e-3, quantize_ms=quant_ms, gemm_ms=gemm_ms,
                                    path=path))
            del a_src, b_src
    name = autotune.device_name(device)
    return dict(device=name, unit="s", tuning=autotune.current().mode, method=(
        "quantization of both operands from BF16 and the GEMM, timed apart: "
        + ("CUDA events, median of 10 after 3 warm-up calls" if events else "wall time or the given timer")),
        entries=entries)
