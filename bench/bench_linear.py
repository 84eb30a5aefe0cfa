"""Linear-layer benchmark: one forward + backward of `SnipLinear` against `nn.Linear` in BF16 and, where
torchao is importable, torchao's `Float8Linear` (row-wise and tensor-wise recipes), on the layer shapes of
Llama-3 8B and 70B with 8192 tokens, side by side in one process.

    python -m bench.bench_linear               # a CUDA GPU: writes bench/results/<device>-linear.json
    python -m bench.bench_linear --profile     # + each bf16 / snip_fp8 entry's kernels (bench.kernel_profile)
    python -m bench.bench_linear --smoke --out X   # seconds on the CPU (tiny shapes, one call each):
                                                   # the code runs, nothing is measured

Layers (in_features -> out_features; o_proj has q_proj's shape, up_proj gate_proj's):
  8B:  q_proj 4096 -> 4096, k_proj/v_proj 4096 -> 1024, gate_proj 4096 -> 14336, down_proj 14336 -> 4096
  70B: q_proj 8192 -> 8192, k_proj/v_proj 8192 -> 1024, gate_proj 8192 -> 28672, down_proj 28672 -> 8192

Variants (BF16 weights and activations, no bias, eager: torch.compile is timed per training step by
bench_step, not here):
  bf16                 nn.Linear (cuBLAS).
  snip_fp8             SnipLinear, recipe "fp8" for all three GEMMs.
  snip_fp8_fused_wgrad the same with fuse_wgrad_accumulation: the weight gradient added into an FP32
                       weight.main_grad by the wgrad GEMM's epilogue (never reset: an accumulation).
  snip_fp8_reused_weight
                       snip_fp8 inside snip_ops.reuse_quantized_weights: the weight quantized at the first
                       call only, as for the micro-batches after the first of a gradient-accumulation step.
  snip_fp4             SnipLinear, recipe "fp4" -- only where an FP4 GEMM kernel exists (Hopper's
                       sm90_fp4, Blackwell's sm100_fp4; anywhere in a smoke run), else skipped.
  snip_fp8_fwd_fp4_bwd SnipLinear, LinearPrecision(fprop="fp8", dgrad="fp4", wgrad="fp4"): a mixed
                       layer as SNIP's plans make them (same gate as snip_fp4).
  torchao_rowwise / torchao_tensorwise
                       torchao.float8.convert_to_float8_training with
                       Float8LinearConfig.from_recipe_name("rowwise" / "tensorwise"); "not importable"
                       (with the reason) where torchao is missing.

What is timed: y = layer(x); y.backward(dy) with x requiring its gradient (so fprop, dgrad and wgrad,
with every quantization the layer does), the gradients reset to None before each call. CUDA events,
the L2 cache flushed before each call, median of `--iters` calls after `--warmup` (snip_train.cuda_timer).
Each entry gives the time, the TFLOP/s of the three GEMMs, and its speed-up over bf16 and over
torchao row-wise (their time over its time: above 1 is faster); the snip entries name the GEMM path of
each GEMM (snip_ops.gemm_kernels.gemm_path).

Without a CUDA GPU the smoke setting is chosen automatically, and --out is still required, so that a
CPU run never writes into bench/results.
"""

from __future__ import annotations

import contextlib
import sys

import torch
from torch import nn

from bench.gpu_bench import apply_tuning, device_and_timer, timing_parser, write_device_result
from bench.kernel_profile import kernel_profile
from bench.run_record import provenance
from snip_ops import LinearPrecision, SnipLinear, _ext, reuse_quantized_weights
from snip_ops.formats import GEMMS, gemm_dims
from snip_ops.gemm_kernels import device_arch, gemm_path

TOKENS = 8192
MODELS = {  # name: (hidden, mlp, kv) -- Llama-3's widths (kv: the k/v projections' out_features)
    "llama3-8b": (4096, 14336, 1024),
    "llama3-70b": (8192, 28672, 1024),
}
SMOKE_MODELS = {"smoke": (256, 384, 128)}
SMOKE_TOKENS = 256
SNIP_VARIANTS = {
    "snip_fp8": LinearPrecision("fp8"),
    "snip_fp4": LinearPrecision("fp4"),
    "snip_fp8_fwd_fp4_bwd": LinearPrecision(fprop="fp8", dgrad="fp4", wgrad="fp4"),
}
REUSED_WEIGHT_VARIANTS = ("snip_fp8_reused_weight",)
PROFILED_VARIANTS = ("bf16", "snip_fp8")  # --profile: where the time of the baseline and of FP8 goes
TORCHAO_RECIPES = ("rowwise", "tensorwise")
FP4_KERNEL_PATHS = ("sm90_fp4", "sm100_fp4")


def layers(hidden: int, mlp: int, kv: int) -> list[tuple[str, int, int]]:
    """(name, in_features, out_features) of a decoder block's distinct linear shapes."""
    return [("q_proj/o_proj", hidden, hidden), ("k_proj/v_proj", hidden, kv),
            ("gate_proj/up_proj", hidden, mlp), ("down_proj", mlp, hidden)]


def torchao_float8():
    """(convert_to_float8_training, Float8LinearConfig, version) or the reason torchao cannot be used."""
    try:
        import torchao
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except Exception as e:  # ImportError, or a torchao built against another torch failing at import
        return f"not importable: {type(e).__name__}: {e}"
    return convert_to_float8_training, Float8LinearConfig, getattr(torchao, "__version__", "unknown")


def snip_paths(precision: LinearPrecision, dev: torch.device, shape: tuple[int, int, int]) -> dict[str, str]:
    """{GEMM: the path qgemm takes for it on `dev`} (with this build's self-checked kernels)."""
    arch = device_arch(dev) if dev.type == "cuda" else None
    available = (lambda k: _ext.kernel_available(k, dev)) if dev.type == "cuda" else None
    return {g: gemm_path(precision.gemm(g), g, arch, available, gemm_dims(g, *shape)).path for g in GEMMS}


def variants(lin: nn.Linear, dev: torch.device, shape, smoke: bool, ao) -> tuple[dict, list[dict]]:
    """({variant: (module, description)}, [{variant, reason} skipped]); every module shares lin's weight."""
    out, skipped = {"bf16": (lin, {"impl": "nn.Linear (BF16)"})}, []
    for name, precision in SNIP_VARIANTS.items():
        paths = snip_paths(precision, dev, shape)
        fp4 = any(precision.gemm(g).name == "fp4" for g in GEMMS)
        if fp4 and not smoke and not all(paths[g] in FP4_KERNEL_PATHS for g in GEMMS if precision.gemm(g).name == "fp4"):
            skipped.append({"variant": name, "reason": f"no FP4 GEMM kernel on this device (paths {paths})"})
            continue
        quantizer = "snip_C::quantize" if _ext.kernel_available("quantize", dev) else "emulated (reference)"
        out[name] = (SnipLinear.from_linear(lin, precision, seed=1, name=name),
                     {"impl": f"SnipLinear {precision}", "paths": paths, "quantizer": quantizer})
        if name == "snip_fp8":  # the weight gradient added into an FP32 main_grad by the wgrad GEMM's epilogue
            fused = SnipLinear.from_linear(lin, precision, seed=1, name=name, fuse_wgrad_accumulation=True)
            lin.weight.main_grad = torch.zeros(lin.weight.shape, device=dev, dtype=torch.float32)
            out["snip_fp8_fused_wgrad"] = (fused, {"impl": f"SnipLinear {precision}, fuse_wgrad_accumulation (main_grad)",
                                              "paths": paths, "quantizer": quantizer})
            out["snip_fp8_reused_weight"] = (
                SnipLinear.from_linear(lin, precision, seed=1, name="snip_fp8_reused_weight"),
                {"impl": f"SnipLinear {precision}, reuse_quantized_weights (weight quantized at the first call only)",
                 "paths": paths, "quantizer": quantizer})
    for recipe_name in TORCHAO_RECIPES:
        name = f"torchao_{recipe_name}"
        if isinstance(ao, str):  # said once, in the result's "torchao"
            continue
        convert, config, _ = ao
        try:
            mod = convert(nn.Sequential(lin), config=config.from_recipe_name(recipe_name))[0]
        except Exception as e:  # e.g. a recipe this torchao or this device does not support
            skipped.append({"variant": name, "reason": f"conversion failed: {type(e).__name__}: {e}"})
            continue
        out[name] = (mod, {"impl": f"torchao Float8Linear, recipe {recipe_name!r} (eager)"})
    return out, skipped


def fwd_bwd(mod: nn.Module, x: torch.Tensor, dy: torch.Tensor):
    """A call that runs one forward + backward of `mod`, its gradients reset first."""
    def call():
        x.grad = None
        mod.weight.grad = None
        mod(x).backward(dy)

    return call


def time_layer(mod: nn.Module, x: torch.Tensor, dy: torch.Tensor, seconds) -> tuple[float, bool]:
    """(seconds of one forward + backward, whether its output and gradients are finite)."""
    t = seconds(fwd_bwd(mod, x, dy))
    dw = mod.weight.main_grad if getattr(mod, "fuse_wgrad_accumulation", False) else mod.weight.grad
    with torch.no_grad():
        finite = bool(torch.isfinite(mod(x)).all() and torch.isfinite(x.grad).all() and torch.isfinite(dw).all())
    return t, finite


def run(args) -> dict:
    if not torch.cuda.is_available():
        args.smoke = True  # the CPU runs the smoke setting only (and device_and_timer still wants --out)
    dev, device, seconds = device_and_timer(args, "bench_linear")
    if args.smoke:  # one intra-op thread: a shared CI machine's cores oversubscribed cost seconds per call
        torch.set_num_threads(1)
    models, tokens = (SMOKE_MODELS, SMOKE_TOKENS) if args.smoke else (MODELS, TOKENS)
    tuning = apply_tuning(args)
    ao = torchao_float8()
    entries, skipped = [], []
    for model, dims in models.items():
        for layer, k, n in layers(*dims):
            gen = torch.Generator(device=dev).manual_seed(0)
            lin = nn.Linear(k, n, bias=False, device=dev, dtype=torch.bfloat16)
            with torch.no_grad():
                lin.weight.normal_(0, k ** -0.5, generator=gen)
            x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16, generator=gen).requires_grad_()
            dy = torch.randn(tokens, n, device=dev, dtype=torch.bfloat16, generator=gen)
            mods, skips = variants(lin, dev, (tokens, n, k), args.smoke, ao)
            skipped += [dict(s, model=model, layer=layer) for s in skips]
            times = {}
            for name, (mod, desc) in mods.items():
                reuse = reuse_quantized_weights(mod) if name in REUSED_WEIGHT_VARIANTS else contextlib.nullcontext()
                try:
                    with reuse:
                        t, finite = time_layer(mod, x, dy, seconds)
                except Exception as e:  # one broken variant must not hide the others' numbers
                    skipped.append({"variant": name, "model": model, "layer": layer,
                                    "reason": f"failed: {type(e).__name__}: {e}"})
                    continue
                times[name] = t
                entries.append(dict(model=model, layer=layer, in_features=k, out_features=n, tokens=tokens,
                                    variant=name, **desc, time_s=t, ms=t * 1e3, finite=finite,
                                    tflops=3 * 2.0 * tokens * n * k / t / 1e12))
                if args.profile and name in PROFILED_VARIANTS:
                    entries[-1]["profile"] = kernel_profile(fwd_bwd(mod, x, dy))
            for e in entries:
                if e["model"] == model and e["layer"] == layer:
                    e["speedup_vs_bf16"] = times["bf16"] / e["time_s"] if "bf16" in times else None
                    row = times.get("torchao_rowwise")
                    e["speedup_vs_torchao_rowwise"] = row / e["time_s"] if row else None
            print_rows([e for e in entries if e["model"] == model and e["layer"] == layer])
            del x, dy, lin, mods
            torch.cuda.empty_cache()  # a no-op where CUDA never started (smoke runs)
    arch = torch.cuda.get_device_capability() if dev.type == "cuda" else None
    return {
        **provenance(" ".join(["python -m bench.bench_linear", *sys.argv[1:]])), "device": device,
        "capability": f"sm_{arch[0]}{arch[1]}" if arch else None, "cuda": torch.version.cuda,
        "threads": torch.get_num_threads(),
        "build": _ext.build_info().get("built_with"), "torchao": ao if isinstance(ao, str) else ao[2],
        "method": "smoke run: one host-clocked call each" if args.smoke else
        f"CUDA events, L2 flushed before each call, median of {args.iters} after {args.warmup} warm-up calls",
        "gemm_tuning": tuning, "tokens": tokens, "entries": entries, "skipped": skipped,
    }


def print_rows(rows: list[dict]) -> None:
    for e in rows:
        ratios = [f"x{e[key]:.2f} vs {base}" for key, base in (("speedup_vs_bf16", "bf16"),
                  ("speedup_vs_torchao_rowwise", "torchao rowwise")) if e[key] is not None]
        print(f"{e['model']:>10} {e['layer']:>17} {e['variant']:>22} {e['ms']:9.3f} ms {e['tflops']:7.1f} TFLOP/s "
              + ", ".join(ratios), flush=True)


def main():
    p = timing_parser(__doc__, "linear")
    p.add_argument("--profile", action="store_true",
                   help=f"record the kernels of the {' and '.join(PROFILED_VARIANTS)} entries (bench.kernel_profile)")
    args = p.parse_args()
    result = run(args)
    print(f"\nwrote {write_device_result(result, 'linear', args.out)}")
    for s in result["skipped"]:
        print(f"skipped {s['model']} {s['layer']} {s['variant']}: {s['reason']}")


if __name__ == "__main__":
    main()
