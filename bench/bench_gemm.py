"""GEMM microbenchmark: snip's low-precision GEMMs vs torch.matmul (BF16) and torch._scaled_mm (FP8,
cuBLAS/CUTLASS), on the shapes of Llama training, for the three GEMMs of a linear layer.

    python -m bench.bench_gemm                 # full run, writes bench/results/<device>-gemm.json
    python -m bench.bench_gemm --quick         # 4096^3 and one Llama shape
    python -m bench.bench_gemm --configs       # also every compiled Hopper tile configuration
    python -m bench.bench_gemm --smoke --out X # seconds on the CPU: the code runs, nothing is measured

Shapes: M = N = K = 4096 and 8192, and Llama-7B/70B layers with M = 8192 tokens and (N, K) in
{(4096, 4096), (11008, 4096), (4096, 11008), (8192, 8192), (28672, 8192), (8192, 28672)}; for a layer
(M, N, K) the GEMMs are (m, n, k) = fprop (M, N, K), dgrad (M, K, N), wgrad (N, K, M) (planner/cost.py).

What is timed (one kernel launch sequence per call, operands prepared beforehand):
  bf16      torch.matmul(a, b.t()) on BF16 tensors (cuBLAS) -- what snip runs for "bf16" layers.
  fp8       snip_C::fp8_gemm_nt_blockwise on prepared operands: E4M3, 1x128 x 128x128 scales
            (fprop, dgrad; BF16 out) or 1x128 x 1x128 (wgrad; FP32 out, as for FP32 weights and
            accumulation; the BF16-output wgrad that BF16 weights take is the baseline fp8_wgrad_bf16,
            set beside _scaled_mm's BF16 output in the targets' bf16_out_* fields).
  fp8_e5m2grad  the same op on that recipe's operands: E5M2 gradients in dgrad and wgrad.
  fp4       (Hopper) snip_ops.gemm_kernels.qgemm on FP4 (E2M1) operands: the E2M1 -> E4M3
            re-encoding, the scale-layout conversion and the FP8 kernel -- the real per-GEMM cost.
  nvfp4 / mxfp4 / mxfp8   (Blackwell only) the sm_100a kernels on prepared operands.
Baselines (not in "entries"): torch._scaled_mm with row-wise and tensor-wise FP32 scales (BF16 out,
use_fast_accum=False), torch._scaled_mm with the same 1x128/128x128 block scales where this torch/cuBLAS
supports it, and qgemm's end-to-end fp8 time (wrapper overhead).

Timing: CUDA events around each call, the L2 cache flushed (a 256 MiB buffer zeroed) before every
call, median of `--iters` calls after `--warmup` calls; random normal data (never zeros).

Output JSON ({"device", "unit": "s", "entries": [{"m", "n", "k", "format", "gemm", "ms", "time", ...}]})
is the planner's measured cost table (planner.cost.MeasuredCost.from_json reads m, n, k, format, time).
"""

from __future__ import annotations

import sys
import time

import torch

from bench.gpu_bench import device_and_timer, timing_parser, write_device_result
from snip_ops import _ext, autotune, gemm_kernels as gk
from snip_ops.formats import gemm_dims
from snip_ops.gemm_timing import layer_gemm_inputs, quantize_for_gemm
from snip_ops.reference import plain_scales

SQUARE = [4096, 8192]
LLAMA_TOKENS = 8192
LLAMA_NK = [(4096, 4096), (11008, 4096), (4096, 11008), (8192, 8192), (28672, 8192), (8192, 28672)]
TARGET_BF16_SQUARE_8192 = 1.6
TARGET_BF16_LLAMA = 1.4
TARGET_SCALED_MM = 0.9


SMOKE_LAYER = ("smoke", 256, 128, 384)


def layers(quick: bool, smoke: bool = False):
    """(label, M, N, K) of the benchmarked linear layers."""
    if smoke:
        return [SMOKE_LAYER]
    out = [(f"square{s}", s, s, s) for s in (SQUARE[:1] if quick else SQUARE)]
    nks = LLAMA_NK[:1] if quick else LLAMA_NK
    out += [(f"llama_N{n}_K{k}", LLAMA_TOKENS, n, k) for n, k in nks]
    return out


def operands(gemm: str, m: int, n: int, k: int, name: str, device: torch.device):
    """Quantized (a, b) of the GEMM, laid out as the linear layer produces them (docs/design.md §3)."""
    return quantize_for_gemm(gemm, name, *layer_gemm_inputs(gemm, m, n, k, device))


def scaled_mm_baselines(a, b, m, n, k) -> dict[str, callable]:
    """torch._scaled_mm on the same FP8 codes: row-wise, tensor-wise, and block-wise scales where
    this torch supports them on the operands' device."""
    device = a.codes.device
    ca, cb = gk._fp8_codes(a, m, k), gk._fp8_codes(b, n, k)  # b.t() is column-major as cuBLAS wants
    ones_a, ones_b = torch.ones(m, 1, device=device), torch.ones(1, n, device=device)
    one = torch.ones((), device=device)
    out = {
        "scaled_mm_rowwise": lambda: torch._scaled_mm(ca, cb.t(), ones_a, ones_b, out_dtype=torch.bfloat16),
        "scaled_mm_tensorwise": lambda: torch._scaled_mm(ca, cb.t(), one, one, out_dtype=torch.bfloat16),
    }
    # Block-wise (cuBLAS >= 12.9 on sm_90): scale_a [m, ceil(k/128)] outer-dim-major, scale_b
    # [ceil(k/128), ceil(n/128) or n]. Layout requirements differ across versions: try both.
    sa = plain_scales(a).float()
    sb = plain_scales(b).float()
    for sa_l, sb_l in ((sa.t().contiguous().t(), sb.t()), (sa.contiguous(), sb.t().contiguous())):
        fn = (lambda x=sa_l, y=sb_l: torch._scaled_mm(ca, cb.t(), x, y, out_dtype=torch.bfloat16))
        try:
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()  # a launch error surfaces here, inside the try
            out["scaled_mm_blockwise"] = fn
            break
        except (RuntimeError, ValueError):
            continue
    return out


def tflops(m, n, k, ms):
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


def run(args) -> dict:
    dev, device, seconds = device_and_timer(args, "bench_gemm")
    arch = torch.cuda.get_device_capability() if dev.type == "cuda" else (0, 0)

    def timer(fn) -> float:  # milliseconds
        return seconds(fn) * 1e3
    sm90 = arch == (9, 0) and _ext.kernel_available("fp8_gemm_nt_blockwise", "cuda")
    sm100 = arch == (10, 0) and _ext.kernel_available("nvfp4_gemm_nt", "cuda")
    if not (sm90 or sm100 or args.smoke):
        print(f"bench_gemm: no snip GEMM kernel for {device} (sm_{arch[0]}{arch[1]}); timing baselines only", file=sys.stderr)
    entries, baselines, configs, mismatches = [], [], [], []
    for label, M, N, K in layers(args.quick, args.smoke):
        for g in ("fprop", "dgrad", "wgrad"):
            m, n, k = gemm_dims(g, M, N, K)
            row = dict(shape=label, gemm=g, m=m, n=n, k=k)

            def add(target, fmt, ms, impl, **extra):
                target.append(dict(row, format=fmt, ms=ms, time=ms * 1e-3, tflops=tflops(m, n, k, ms), impl=impl,
                                   **extra))
                print(f"{label:>20} {g:5} m={m:5} n={n:5} k={k:5} {fmt:26} {ms:8.3f} ms {tflops(m, n, k, ms):7.1f} TFLOPS", flush=True)

            gen = torch.Generator(device=dev).manual_seed(0)
            xa = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=gen)
            xb = torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=gen)
            add(entries, "bf16", timer(lambda: torch.matmul(xa, xb.t())), "torch.matmul bf16 (cuBLAS)")
            del xa, xb

            a, b = operands(g, m, n, k, "fp8", dev)
            for name, fn in scaled_mm_baselines(a, b, m, n, k).items():
                add(baselines, name, timer(fn), "torch._scaled_mm, BF16 out, use_fast_accum=False")
            if sm90:
                out_dtype = torch.float32 if g == "wgrad" else torch.bfloat16
                ca, sfa, cb, sfb, bb, _ = gk.prepare_sm90(a, b, out_dtype)
                op = torch.ops.snip_C.fp8_gemm_nt_blockwise
                sms = torch.cuda.get_device_properties().multi_processor_count
                chosen = torch.ops.snip_C.fp8_gemm_nt_blockwise_config(m, n, k, bb, out_dtype, sms)
                add(entries, "fp8", timer(lambda: op(ca, sfa, cb, sfb, bb, out_dtype)), f"snip CUTLASS sm90: {chosen}")
                add(baselines, "fp8_qgemm", timer(lambda: gk.qgemm(a, b, out_dtype=out_dtype, path="sm90_fp8")),
                    "snip_ops.gemm_kernels.qgemm end to end (scale conversion + kernel)")
                if g == "wgrad" and cb.shape[0] % 8 == 0:  # the weight gradient's other output modes, beside FP32 out
                    grad = torch.zeros(m, cb.shape[0], device=dev, dtype=torch.float32)
                    add(baselines, "fp8_wgrad_accumulate",
                        timer(lambda: torch.ops.snip_C.fp8_gemm_nt_blockwise_acc(ca, sfa, cb, sfb, bb, grad)),
                        "snip CUTLASS sm90: wgrad added into an FP32 gradient buffer by the epilogue (beta = 1)")
                    add(baselines, "fp8_wgrad_bf16", timer(lambda: op(ca, sfa, cb, sfb, bb, torch.bfloat16)),
                        "snip CUTLASS sm90: wgrad with BF16 output (the layer's, for BF16 weights)")
                    del grad
                # The autotuner's candidates, so that its committed table comes from this file; wgrad's also
                # with BF16 output, which the layer's wgrad writes for BF16 weights (the heuristic's time for
                # it is fp8_wgrad_bf16 above).
                for cfg_dtype in (out_dtype, torch.bfloat16) if g == "wgrad" else (out_dtype,):
                    if not args.configs:
                        break
                    dtype_name = str(cfg_dtype).removeprefix("torch.")
                    kind = autotune.GemmKind("fp8_gemm_nt_blockwise", bb, dtype_name, False)
                    reference = op(ca, sfa, cb, sfb, bb, cfg_dtype)
                    for cfg in filter(None, autotune.candidates(kind)):
                        # as the autotuner: a config whose output differs from the heuristic's is a kernel
                        # bug, recorded and never timed, so that no table can choose it
                        if not autotune.same_bits(op(ca, sfa, cb, sfb, bb, cfg_dtype, None, cfg), reference):
                            mismatches.append(dict(row, config=cfg, out_dtype=dtype_name))
                            print(f"bench_gemm: config {cfg} differs from the heuristic's output on {row}", file=sys.stderr)
                            continue
                        add(configs, f"fp8[{cfg}]", timer(lambda c=cfg, d=cfg_dtype: op(ca, sfa, cb, sfb, bb, d, None, c)),
                            cfg, out_dtype=dtype_name)
                    del reference
                del ca, sfa, cb, sfb
                # fp8_e5m2grad: its dgrad and wgrad multiply E5M2 gradients (kernels of their own), fprop as fp8
                a5, b5 = operands(g, m, n, k, "fp8_e5m2grad", dev)
                c5a, s5a, c5b, s5b, bb5, _ = gk.prepare_sm90(a5, b5, out_dtype)
                add(entries, "fp8_e5m2grad", timer(lambda: op(c5a, s5a, c5b, s5b, bb5, out_dtype)),
                    f"snip CUTLASS sm90, {a5.spec.element.name.upper()} x {b5.spec.element.name.upper()}")
                del a5, b5, c5a, s5a, c5b, s5b
                a4, b4 = operands(g, m, n, k, "fp4", dev)
                add(entries, "fp4", timer(lambda: gk.qgemm(a4, b4, out_dtype=out_dtype, path="sm90_fp4")),
                    "snip sm90_fp4: E2M1 -> E4M3 re-encoding + scale conversion + FP8 kernel")
                del a4, b4
            if sm100:
                for kind in ("nvfp4", "mxfp4", "mxfp8"):
                    ka, kb_ = operands(g, m, n, k, kind, dev)
                    ca, sfa, cb, sfb, alpha, _ = gk.prepare_sm100(kind, ka, kb_)
                    op = getattr(torch.ops.snip_C, f"{kind}_gemm_nt")
                    fn = (lambda: op(ca, sfa, cb, sfb, alpha)) if kind == "nvfp4" else (lambda: op(ca, sfa, cb, sfb))
                    add(entries, kind, timer(fn), f"snip CUTLASS sm100 {kind}")
            del a, b
            torch.cuda.empty_cache()  # a no-op where CUDA never started (smoke runs)
    return dict(
        device=device, capability=f"sm_{arch[0]}{arch[1]}" if dev.type == "cuda" else None, unit="s",
        torch=torch.__version__, cuda=torch.version.cuda, build=_ext.build_info().get("built_with"),
        method="smoke run: one host-clocked call each" if args.smoke else
        f"CUDA events, L2 flushed before each call, median of {args.iters} after {args.warmup} warm-up calls",
        date=time.strftime("%Y-%m-%d %H:%M:%S"), entries=entries, baselines=baselines, configs=configs,
        config_mismatches=mismatches,
        targets=targets(entries, baselines),
    )


def targets(entries, baselines) -> list[dict]:
    """Speed-ups of snip's fp8 GEMM over BF16 and torch._scaled_mm, against the issue's targets."""
    t = {(e["shape"], e["gemm"], e["format"]): e["ms"] for e in entries + baselines}
    out = []
    for (shape, g, fmt), ms in t.items():
        if fmt != "fp8":
            continue
        row = dict(shape=shape, gemm=g, fp8_ms=ms)
        row["vs_bf16"] = t[(shape, g, "bf16")] / ms
        row["target_vs_bf16"] = TARGET_BF16_LLAMA if shape.startswith("llama") else (
            TARGET_BF16_SQUARE_8192 if shape == "square8192" else None)
        for base in ("scaled_mm_rowwise", "scaled_mm_tensorwise", "scaled_mm_blockwise"):
            if (shape, g, base) in t:
                row[f"vs_{base}"] = t[(shape, g, base)] / ms
        row["target_vs_scaled_mm"] = TARGET_SCALED_MM
        if (shape, g, "fp8_wgrad_bf16") in t:  # the layer's wgrad for BF16 weights, BF16 out like _scaled_mm's
            row["bf16_out_ms"] = t[(shape, g, "fp8_wgrad_bf16")]
            if (shape, g, "scaled_mm_rowwise") in t:
                row["bf16_out_vs_scaled_mm_rowwise"] = t[(shape, g, "scaled_mm_rowwise")] / row["bf16_out_ms"]
        row["pass"] = (row["target_vs_bf16"] is None or row["vs_bf16"] >= row["target_vs_bf16"]) and all(
            row[f"vs_{b}"] >= TARGET_SCALED_MM for b in ("scaled_mm_rowwise", "scaled_mm_tensorwise") if f"vs_{b}" in row)
        out.append(row)
    return out


def main():
    p = timing_parser(__doc__, "gemm")
    p.add_argument("--quick", action="store_true", help="4096^3 and one Llama shape only")
    p.add_argument("--configs", action="store_true", help="also time every compiled Hopper tile configuration")
    args = p.parse_args()
    result = run(args)
    print(f"\nwrote {write_device_result(result, 'gemm', args.out)}")
    for r in result["targets"]:
        extra = " ".join(f"{k[3:]}={v:.2f}x" for k, v in r.items() if k.startswith("vs_"))
        print(f"{r['shape']:>20} {r['gemm']:5} {'PASS' if r['pass'] else 'MISS'} {extra}")


if __name__ == "__main__":
    main()
