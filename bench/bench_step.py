"""Training-step benchmark: one step (forward, loss, backward, gradient clipping, AdamW) of the `1b` Llama
preset, tokens per second and peak memory, for BF16, FP8, a SNIP plan at 75% FP4 and torchao float8, each
eager and under torch.compile, side by side in one process.

    python -m bench.bench_step                  # a CUDA GPU: writes bench/results/<device>-step.json
    python -m bench.bench_step --smoke --out X  # seconds on the CPU (the `tiny` preset, batch 2 x 32,
                                                # 1 + 2 steps): the code runs, nothing is measured

Variants (every projection of every block; lm_head and the embedding stay high precision, as
`snip_ops.convert` leaves them):
  bf16                nn.Linear.
  fp8                 snip_ops.convert(model, LinearPrecision("fp8")).
  snip_75             a fixed plan with 75% of the linear FLOPs in FP4 (`fixed_plan`): a stand-in for
                      a plan the planner measures and solves for, of the form SNIP's plans take on the
                      H200 main job (bench/results/nvidia-h200-main-job.md): dgrad and wgrad FP4
                      everywhere, fprop FP8 except in the widest projections, whose fprop goes FP4
                      kind by kind (all gate_proj first) until the FP4 share, by planner.plan_metrics,
                      reaches 75%. A step's speed depends on which GEMMs run in which format, not on
                      how the plan was chosen; the plan and its share are in the result.
  torchao_rowwise / torchao_tensorwise
                      torchao.float8.convert_to_float8_training with those recipes, where importable.
Each once eager and once with every decoder block compiled (`block.compile()`, as torchtitan does:
identical blocks share one compiled graph, so compiling takes the time of one block, not sixteen; each
compiled run records how many graphs dynamo compiled, `compiled_graphs`, which a recompile per layer
would raise above BF16's).

Setup as `snip train` on a GPU: FP32 parameters, bf16 autocast (on the CPU float32, no autocast),
torch.optim.AdamW (fused on CUDA), gradients clipped to norm 1; batch 4 x 2048 tokens; one fixed batch.
Each run builds its model afresh under the same seed. Timing: CUDA events around each step (host
clock on the CPU), median of `--iters` steps after `--warmup` (the first step, compilation included,
is reported apart as first_step_s). Peak memory: torch.cuda.max_memory_allocated over the run, from
before the model is built (None on the CPU). Speed-ups are BF16's median step time over the
variant's, with the same compile setting and against eager BF16. The result is rewritten after every
run ("complete": false until the last), so that a run cut short keeps what it measured.

On the CPU smoke, compiled runs use the "aot_eager" backend (dynamo and AOT autograd trace the step,
no code is generated): it checks that every variant compiles without a graph break failing it, in a
fraction of what inductor's code generation takes on a CPU.
"""

from __future__ import annotations

import fnmatch
import gc
import statistics
import sys
import time

import torch

from bench.bench_linear import torchao_float8
from bench.gpu_bench import add_timing_options, apply_tuning, device_and_timer, write_device_result
from bench.run_record import provenance
from planner import Budget, LayerShape, Plan, plan_metrics
from snip_ops import LinearPrecision, _ext, convert
from snip_ops.module import DEFAULT_EXCLUDE
from snip_train.model import Llama, LlamaConfig

FP4_FRACTION = 0.75
FORWARD_FP4_ORDER = ("gate_proj", "up_proj", "down_proj", "q_proj", "o_proj", "k_proj", "v_proj")
VARIANTS = ("bf16", "fp8", "snip_75", "torchao_rowwise", "torchao_tensorwise")
PLAN_RULE = ("dgrad and wgrad FP4 in every layer; fprop FP8, except in whole projection kinds, taken in the order "
             f"{', '.join(FORWARD_FP4_ORDER)}, whose fprop goes FP4 until {FP4_FRACTION:.0%} of the linear FLOPs are FP4")
SMOKE = dict(preset="tiny", batch_size=2, seq_len=32, warmup=1, iters=2)


def converted(name: str) -> bool:
    """Whether `snip_ops.convert` converts the linear layer `name` by default (the others stay high precision)."""
    return not any(fnmatch.fnmatchcase(name, pattern) for pattern in DEFAULT_EXCLUDE)


def linear_shapes(model: torch.nn.Module, tokens: int) -> dict[str, LayerShape]:
    """The layers `snip_ops.convert` converts by default, with the tokens of one step."""
    return {n: LayerShape(n, m.in_features, m.out_features, tokens) for n, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and converted(n)}


def fixed_plan(shapes: dict[str, LayerShape], fraction: float = FP4_FRACTION) -> Plan:
    """Backward GEMMs FP4 everywhere; the forward GEMM FP4 for whole projection kinds, in
    FORWARD_FP4_ORDER, until `fraction` of the linear FLOPs are FP4. One LinearPrecision object per
    precision, shared by the layers, so that compiled identical blocks stay one graph."""
    mixed, fp4 = LinearPrecision(fprop="fp8", dgrad="fp4", wgrad="fp4"), LinearPrecision("fp4")
    precisions = {n: mixed for n in shapes}

    def share() -> float:
        return plan_metrics(Plan(precisions).assignment(), shapes).fp4_fraction

    for kind in FORWARD_FP4_ORDER:
        if share() >= fraction:
            break
        precisions.update({n: fp4 for n in shapes if n.rsplit(".", 1)[-1] == kind})
    m = plan_metrics(Plan(precisions).assignment(), shapes)
    return Plan(precisions, method="fixed", candidates=("fp8", "fp4"), budget=Budget.fp4_fraction(fraction).to_json(),
                metrics={"fp4_fraction": m.fp4_fraction, "relative_cost": m.relative_cost})


def build(variant: str, cfg: LlamaConfig, dev: torch.device, plan: Plan, ao) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device(dev):
        model = Llama(cfg)
    if variant == "fp8":
        return convert(model, LinearPrecision("fp8"))
    if variant == "snip_75":
        return convert(model, dict(plan.precisions))
    if variant.startswith("torchao_"):
        if isinstance(ao, str):
            raise RuntimeError(f"torchao {ao}")
        to_float8, config, _ = ao
        return to_float8(model, module_filter_fn=lambda mod, fqn: converted(fqn),
                         config=config.from_recipe_name(variant.removeprefix("torchao_")))
    return model


def run_variant(variant: str, compiled: bool, args, cfg, dev, plan, ao, batch) -> dict:
    """One variant's run: warm-up steps, then `args.iters` timed ones."""
    gc.collect()
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model = build(variant, cfg, dev, plan, ao)
    backend = args.compile_backend if compiled else None
    if compiled:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        for block in model.model.layers:
            block.compile(backend=backend)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=cuda)
    autocast = torch.autocast("cuda", torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)

    def step() -> torch.Tensor:
        with autocast:
            loss = model.loss(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    losses, times = [], []
    for i in range(args.warmup + args.iters):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        losses.append(step())
        if cuda:
            end.record()
            end.synchronize()
            t = start.elapsed_time(end) / 1e3
        else:
            t = time.perf_counter() - t0
        if i == 0:
            first = time.perf_counter() - t0
        if i >= args.warmup:
            times.append(t)
    losses = torch.stack(losses).float().cpu()
    median = statistics.median(times)
    out = {"variant": variant, "compiled": compiled, "compile_backend": backend, "first_step_s": first,
           "step_s": times, "median_step_s": median, "tokens_per_s": batch.shape[0] * (batch.shape[1] - 1) / median,
           "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else None,
           # identical blocks share one compiled graph: more than BF16's count means a recompile per layer
           "compiled_graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"] if compiled else None,
           "losses": losses.tolist(), "finite": bool(torch.isfinite(losses).all())}
    del model, opt
    return out


def speedups(runs: list[dict]) -> None:
    """Each run's speed-up over BF16 with the same compile setting, and over eager BF16."""
    bf16 = {r["compiled"]: r["median_step_s"] for r in runs if r["variant"] == "bf16" and "median_step_s" in r}
    for r in runs:
        if "median_step_s" in r:
            same, eager = bf16.get(r["compiled"]), bf16.get(False)
            r["speedup_vs_bf16_same_compile"] = same / r["median_step_s"] if same else None
            r["speedup_vs_bf16_eager"] = eager / r["median_step_s"] if eager else None


def run(args) -> dict:
    if not torch.cuda.is_available():
        args.smoke = True  # the CPU runs the smoke setting only (and device_and_timer still wants --out)
    dev, device, _ = device_and_timer(args, "bench_step")
    if args.smoke:  # one intra-op thread: a shared CI machine's cores oversubscribed cost seconds per call
        torch.set_num_threads(1)
    if args.smoke:
        for key, value in SMOKE.items():
            setattr(args, key, value)
    args.compile_backend = "aot_eager" if args.smoke else "inductor"
    tuning = apply_tuning(args)
    cfg = LlamaConfig.preset(args.preset)
    cfg = LlamaConfig.preset(args.preset, max_seq_len=max(args.seq_len, cfg.max_seq_len))
    tokens = args.batch_size * args.seq_len
    with torch.device("meta"):  # shapes only
        skeleton = Llama(cfg)
    plan = fixed_plan(linear_shapes(skeleton, tokens))
    ao = torchao_float8()
    gen = torch.Generator().manual_seed(1)
    batch = torch.randint(0, cfg.vocab_size, (args.batch_size, args.seq_len + 1), generator=gen).to(dev)
    arch = torch.cuda.get_device_capability() if dev.type == "cuda" else None
    result = {
        **provenance(" ".join(["python -m bench.bench_step", *sys.argv[1:]])), "device": device,
        "capability": f"sm_{arch[0]}{arch[1]}" if arch else None, "cuda": torch.version.cuda,
        "threads": torch.get_num_threads(),
        "build": _ext.build_info().get("built_with"), "torchao": ao if isinstance(ao, str) else ao[2],
        "quantizer": "snip_C::quantize" if _ext.kernel_available("quantize", dev) else "emulated (reference)",
        "preset": args.preset, "params": sum(p.numel() for p in skeleton.parameters()),
        "batch_size": args.batch_size, "seq_len": args.seq_len, "tokens_per_step": tokens,
        "compute": "bf16 autocast, FP32 parameters" if dev.type == "cuda" else "float32",
        "optimizer": "torch.optim.AdamW" + (" (fused)" if dev.type == "cuda" else ""),
        "method": ("smoke run: host clock" if args.smoke else "CUDA events around each step")
        + f", median of {args.iters} steps after {args.warmup} warm-up steps",
        "compile": f"every decoder block, backend {args.compile_backend!r}", "gemm_tuning": tuning,
        "snip_75_plan": {"rule": PLAN_RULE, **plan.to_json(with_stats=False)},
        "runs": [], "failed": [], "complete": False,
    }
    # Every eager run first: a run cut short still compares them, and the kernels' self-checks (run at
    # their first use) have run eagerly before dynamo traces a step.
    for compiled in (False, True):
        for variant in VARIANTS:
            if variant.startswith("torchao_") and isinstance(ao, str):
                continue  # said once, in "torchao"
            try:
                r = run_variant(variant, compiled, args, cfg, dev, plan, ao, batch)
            except Exception as e:  # one broken variant must not hide the others' numbers
                result["failed"].append({"variant": variant, "compiled": compiled,
                                         "reason": f"{type(e).__name__}: {str(e)[:2000]}"})
                print(f"{variant} compiled={compiled} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                continue
            result["runs"].append(r)
            speedups(result["runs"])
            print_run(r)
            write_device_result(result, "step", args.out)
    result["complete"] = True
    return result


def print_run(r: dict) -> None:
    mem = f"{r['peak_memory_bytes'] / 2**30:6.1f} GiB" if r["peak_memory_bytes"] is not None else "   n/a"
    same, eager = r["speedup_vs_bf16_same_compile"], r["speedup_vs_bf16_eager"]
    print(f"{r['variant']:>18} {'compiled' if r['compiled'] else 'eager':>8} {1e3 * r['median_step_s']:9.1f} ms "
          f"{r['tokens_per_s']:10.0f} tok/s peak {mem}  first step {r['first_step_s']:6.1f} s  "
          + (f"x{same:.2f} vs bf16 same compile" if same else "")
          + (f", x{eager:.2f} vs eager bf16" if eager else ""), flush=True)


def main():
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_timing_options(p, "step", warmup=3, iters=10)
    p.add_argument("--preset", default="1b", help="snip_train.model preset (the smoke run: tiny)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=2048)
    args = p.parse_args()
    result = run(args)
    print(f"\nwrote {write_device_result(result, 'step', args.out)}")
    for f in result["failed"]:
        print(f"failed {f['variant']} compiled={f['compiled']}: {f['reason'][:300]}")


if __name__ == "__main__":
    main()
