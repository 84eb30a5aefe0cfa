"""Quantization microbenchmark: snip_C::quantize's achieved bandwidth as a fraction of a device-to-device
copy measured in the same run, and its speed-up over torch eager quantization written the obvious way.

    python -m bench.bench_quant            # full run, writes bench/results/<device>-quant.json
    python -m bench.bench_quant --quick    # 8192x8192 only
    python -m bench.bench_quant --smoke --out X   # seconds on the CPU (the CPU implementation of
                                                  # snip_C::quantize): the code runs, nothing is measured

Inputs: BF16, 8192x8192 and Llama-7B activation shapes with M = 8192 tokens: [8192, 4096] (x of the
q/k/v/o/gate/up projections, dy of o/down) and [8192, 11008] (x of down, dy of gate/up).

Bandwidth = (bytes read + bytes written) / time: x once (twice when nvfp4 computes its tensor amax in a
first pass), codes, scales. The copy baseline is `dst.copy_(x)` of the same input (2 x its bytes).
SR variants draw their bits at a linear layer's offsets, equal for t and t^T, so the fused row + column
ones compute one Philox stream for both outputs, as training does.

Targets (issue #4): >= 0.80 of copy for fp8 row-wise RNE; >= 0.75 for the fused row + column
(transposed) variants and for SR; >= 0.70 for nvfp4 with the Blackwell scale layout.

Eager baselines (speed-up reported, not a target): the same quantization as a sequence of torch ops
(block amax, scale, divide, round and cast; SR with torch.rand instead of Philox; FP4 rounding on the
E2M1 grid with torch.bucketize, nibbles packed with shifts), i.e. what one writes without a kernel.

Timing: CUDA events around each call, the L2 cache flushed (a 256 MiB buffer zeroed) before every call,
median of `--iters` calls after `--warmup` calls; random normal data.
"""

from __future__ import annotations

import sys
import time

import torch

from bench.gpu_bench import device_and_timer, timing_parser, write_device_result
from snip_ops import _ext
from snip_ops.formats import E2M1, E4M3, QuantSpec, Rounding, ScaleKind
from snip_ops.gemm import operand_offset

# SR offsets of x and x^T (or dy and dy^T) as a linear layer passes them: equal, so a fused row + column
# SR pass computes one Philox stream for both outputs (docs/design.md §2).
OFFSET, OFFSET_T = operand_offset(1, "dy"), operand_offset(1, "dyt")

SQUARE = (8192, 8192)
LLAMA = [(8192, 4096), (8192, 11008)]
SMOKE = (256, 384)


# ---- the benchmarked variants ----
# (name, spec, rowwise, colwise, scale layout, nvfp4 amax passed in, target fraction): each in the scale layout
# its GEMM reads (gemm_kernels.scale_layout_for), as training quantizes it
FP8 = QuantSpec(E4M3, (1, 128))
FP8_SR = QuantSpec(E4M3, (1, 128), rounding=Rounding.SR)
FP8_W = QuantSpec(E4M3, (128, 128))
MXFP8 = QuantSpec(E4M3, (1, 32), ScaleKind.E8M0)
NVFP4 = QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4)
NVFP4_SR = QuantSpec(E2M1, (1, 16), ScaleKind.NVFP4, Rounding.SR)
MXFP4_SR = QuantSpec(E2M1, (1, 32), ScaleKind.E8M0, Rounding.SR)
FP4_SR = QuantSpec(E2M1, (1, 128), rounding=Rounding.SR)
VARIANTS = [
    ("fp8_row_rne", FP8, True, False, "hopper", False, 0.80),
    ("fp8_row_sr", FP8_SR, True, False, "hopper", False, 0.75),
    ("fp8_rowcol_rne", FP8, True, True, "hopper", False, 0.75),
    ("fp8_rowcol_sr", FP8_SR, True, True, "hopper", False, 0.75),
    ("fp8_col_rne", FP8, False, True, "hopper", False, 0.75),
    ("fp8_w128_rowcol_rne", FP8_W, True, True, "hopper", False, 0.75),
    ("mxfp8_row_rne_blackwell", MXFP8, True, False, "blackwell", False, 0.70),
    ("nvfp4_row_rne_blackwell", NVFP4, True, False, "blackwell", True, 0.70),
    ("nvfp4_row_rne_blackwell_amax_pass", NVFP4, True, False, "blackwell", False, None),
    ("nvfp4_row_sr_blackwell", NVFP4_SR, True, False, "blackwell", True, 0.70),
    ("nvfp4_rowcol_sr_blackwell", NVFP4_SR, True, True, "blackwell", True, 0.70),
    ("mxfp4_rowcol_sr_blackwell", MXFP4_SR, True, True, "blackwell", False, 0.70),
    ("fp4_row_sr", FP4_SR, True, False, "hopper", False, 0.75),
]


def moved_bytes(x: torch.Tensor, outs, amax_pass: bool) -> int:
    n = x.numel() * x.element_size() * (2 if amax_pass else 1)
    return n + sum(t.numel() * t.element_size() for t in outs[:4])


# ---- torch eager, written the obvious way ----

_E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _blocks(x, bc):
    m, k = x.shape
    return x.float().reshape(m, k // bc, bc)


def _directions(one, x, rowwise, colwise):
    """one(x) and/or one(x^T): eager code quantizes the transpose as a separate pass over a copy."""
    return (one(x) if rowwise else ()) + (one(x.t().contiguous()) if colwise else ())


def eager_fp8(x, spec, rowwise, colwise):
    def one(t):
        b = _blocks(t, spec.block[1])
        amax = b.abs().amax(-1, keepdim=True)
        s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
        v = b / s
        if spec.rounding == Rounding.SR:  # add uniform noise of one quantum, then truncate
            q = torch.exp2(torch.floor(torch.log2(v.abs().clamp(min=2.0**-6)))) / 8
            v = torch.sign(v) * torch.floor(v.abs() / q + torch.rand_like(v)) * q
        return v.clamp(-448, 448).to(torch.float8_e4m3fn).reshape(t.shape), s.squeeze(-1)
    return _directions(one, x, rowwise, colwise)


def eager_fp8_w128(x, colwise):
    m, k = x.shape
    b = x.float().reshape(m // 128, 128, k // 128, 128)
    amax = b.abs().amax(dim=(1, 3), keepdim=True)
    s = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    codes = (b / s).to(torch.float8_e4m3fn).reshape(m, k)
    return (codes, s, codes.t().contiguous()) if colwise else (codes, s)


def _e2m1_codes(v, sr):
    a = v.abs().clamp(max=6.0)
    grid = _E2M1_GRID.to(v.device)
    hi = torch.bucketize(a, grid).clamp(max=7)        # first grid value >= a
    lo = (hi - 1).clamp(min=0)
    glo, ghi = grid[lo], grid[hi]
    frac = torch.where(ghi > glo, (a - glo) / (ghi - glo), torch.zeros_like(a))
    up = frac > torch.rand_like(a) if sr else frac > 0.5
    mag = torch.where(up, hi, lo)
    return (mag | (torch.signbit(v).to(mag.dtype) << 3)).to(torch.uint8)


def eager_fp4(x, spec, rowwise, colwise):
    nvfp4 = spec.scale == ScaleKind.NVFP4
    ts = x.float().abs().amax() / (448.0 * 6.0) if nvfp4 else None

    def one(t):
        b = _blocks(t, spec.block[1])
        amax = b.abs().amax(-1, keepdim=True)
        if nvfp4:
            s8 = (amax / (ts * 6.0)).clamp(max=448).to(torch.float8_e4m3fn)
            s = s8.float() * ts
        elif spec.scale == ScaleKind.E8M0:
            s = torch.exp2(torch.ceil(torch.log2(amax / 6.0)))
            s8 = s.to(torch.float8_e8m0fnu)
        else:
            s = s8 = amax / 6.0
        s = torch.where(amax > 0, s, torch.ones_like(s))
        c = _e2m1_codes(b / s, spec.rounding == Rounding.SR).reshape(t.shape)
        return (c[:, 0::2] | (c[:, 1::2] << 4)), s8.squeeze(-1)
    return _directions(one, x, rowwise, colwise)


def eager(x, spec, rowwise, colwise):
    if spec.block == (128, 128):  # w and w^T share the 128x128 scales
        return lambda: eager_fp8_w128(x, colwise)
    if spec.element == E4M3:
        return lambda: eager_fp8(x, spec, rowwise, colwise)
    return lambda: eager_fp4(x, spec, rowwise, colwise)


def run(args) -> dict:
    dev, device, timer = device_and_timer(args, "bench_quant")
    if not _ext.kernel_available("quantize", dev.type):
        sys.exit(f"bench_quant: snip_C::quantize is not built for {device}: {_ext.build_info()}")
    shapes = [SMOKE] if args.smoke else [SQUARE] + ([] if args.quick else LLAMA)
    entries = []
    for m, k in shapes:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        dst = torch.empty_like(x)
        t_copy = timer(lambda: dst.copy_(x))
        copy_bw = 2 * x.numel() * x.element_size() / t_copy
        amax = x.float().abs().amax()
        print(f"[{m}x{k}] copy {copy_bw / 1e9:.0f} GB/s", flush=True)
        for name, spec, rowwise, colwise, layout, amax_in, target in VARIANTS:
            ta = amax if (amax_in and spec.scale == ScaleKind.NVFP4) else None

            def fn(spec=spec, rowwise=rowwise, colwise=colwise, ta=ta, layout=layout):
                return torch.ops.snip_C.quantize(x, spec.describe(), rowwise, colwise, 1, OFFSET, OFFSET_T, ta,
                                                 layout, 1)

            t = timer(fn)
            amax_pass = spec.scale == ScaleKind.NVFP4 and ta is None
            nbytes = moved_bytes(x, fn(), amax_pass)
            frac = nbytes / t / copy_bw
            t_eager = timer(eager(x, spec, rowwise, colwise))
            entry = {
                "shape": [m, k], "variant": name, "spec": spec.describe(), "rowwise": rowwise, "colwise": colwise,
                "scale_layout": layout, "sr_offsets": [OFFSET, OFFSET_T], "tensor_amax_pass": amax_pass,
                "time_s": t, "bytes": nbytes,
                "GBps": nbytes / t / 1e9, "copy_GBps": copy_bw / 1e9, "fraction_of_copy": frac,
                "target": target, "pass": None if target is None or args.smoke else frac >= target,
                "eager_time_s": t_eager, "speedup_vs_eager": t_eager / t,
            }
            entries.append(entry)
            verdict = {None: "", True: "PASS", False: "MISS"}[entry["pass"]]
            print(f"  {name:36} {t * 1e6:8.1f} us {nbytes / t / 1e9:7.0f} GB/s  {frac:5.2f} of copy "
                  f"(target {target})  {verdict:4}  eager {t_eager / t:5.1f}x slower", flush=True)
    return {
        "device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
        "build": _ext.build_info().get("built_with"), "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python -m bench.bench_quant", *sys.argv[1:]]), "warmup": args.warmup, "iters": args.iters, "entries": entries,
    }


def main():
    p = timing_parser(__doc__, "quant")
    p.add_argument("--quick", action="store_true", help="8192x8192 only")
    args = p.parse_args()
    result = run(args)
    print(f"\nwrote {write_device_result(result, 'quant', args.out)}")
    missed = [f"{e['shape']} {e['variant']}" for e in result["entries"] if e["pass"] is False]
    if args.smoke:
        print("smoke run: no verdicts")
    else:
        print("all targets met" if not missed else "targets missed: " + ", ".join(missed))


if __name__ == "__main__":
    main()
