"""BF16 + stochastic-rounding AdamW benchmarks (snip_ops.optim.AdamW).

    python bench/bench_optim.py quality   # tiny Llama: bf16+SR vs FP32-master mixed precision vs bf16 nearest
    python bench/bench_optim.py memory    # bytes per parameter of each strategy, analytic and measured
    python bench/bench_optim.py gpu       # step time on 1B parameters vs torch.optim.AdamW(fused=True) + BF16 copy

quality and memory run on the CPU and write bench/results/cpu-optim-<name>.{json,md}; gpu writes
bench/results/<device>-optim.json.

Strategies (all with BF16 autocast compute, so only the weight storage and update differ):
  master        FP32 parameters = the FP32 master copy, torch.optim.AdamW; the BF16 weights the GEMMs
                see are autocast's per-use copies (the memory table also lists the Megatron-style
                layout with a persistent BF16 copy)
  bf16_sr       BF16 parameters, snip_ops.optim.AdamW writing back with stochastic rounding
  bf16_nearest  BF16 parameters, the same optimizer writing back with round-to-nearest-even
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from run_record import provenance, write_result  # noqa: E402

STRATEGIES = {"master": "fp32", "bf16_sr": "bf16_sr", "bf16_nearest": "bf16_nearest"}  # -> TrainConfig.weights


# ---- quality ----------------------------------------------------------------------------------


def _quality_cell(cell: tuple[str, float, int, int]) -> dict:
    strategy, lr, seed, steps = cell
    torch.set_num_threads(1)
    from snip_train.train import TrainConfig, train

    t0 = time.perf_counter()
    s = train(TrainConfig(preset="tiny", steps=steps, batch_size=8, seq_len=64, lr=lr, warmup_steps=steps // 10,
                          weights=STRATEGIES[strategy], amp=True, seed=seed, eval_interval=0, eval_batches=8,
                          progress=False))
    return {"strategy": strategy, "lr": lr, "seed": seed, "final_val_loss": s["final_val_loss"],
            "final_train_loss": s["final_train_loss"], "diverged": s["diverged"],
            "time_s": time.perf_counter() - t0}


def quality(args) -> None:
    cells = [(st, lr, seed, args.steps) for lr in args.lrs for st in STRATEGIES for seed in range(args.seeds)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        rows = list(pool.map(_quality_cell, cells))
    wall = time.perf_counter() - t0
    table: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        table.setdefault(r["strategy"], {}).setdefault(str(r["lr"]), []).append(r["final_val_loss"])
    cmd = (f"python bench/bench_optim.py quality --steps {args.steps} --seeds {args.seeds} "
           f"--lrs {','.join(map(str, args.lrs))} --workers {args.workers}")
    result = {**provenance(cmd), "wall_s": wall, "setup": "tiny Llama (853K params), batch 8 x 64 tokens, AdamW betas "
              "(0.9, 0.95), weight decay 0.1, warmup 10% + cosine to 0.1 x lr, grad clip 1.0, BF16 autocast compute",
              "steps": args.steps, "rows": rows, "mean_final_val_loss": {
                  st: {lr: statistics.mean(v) for lr, v in by_lr.items()} for st, by_lr in table.items()}}
    lines = [f"# BF16 + SR AdamW: training quality (CPU)\n",
             f"- date {result['date']}, commit {result['commit']}", f"- command: `{cmd}`",
             f"- {result['setup']}; {args.steps} steps; {args.seeds} seeds; wall {wall / 60:.1f} min on "
             f"{result['cpus']} cores (load at start {result['loadavg_at_start'][0]:.1f})",
             "- value: final validation loss (nats/token, 8 fixed held-out batches), mean ± std over seeds\n",
             "| strategy | " + " | ".join(f"lr {lr:g}" for lr in args.lrs) + " |",
             "|---|" + "---|" * len(args.lrs)]
    for st in STRATEGIES:
        vals = []
        for lr in args.lrs:
            v = table[st][str(lr)]
            vals.append(f"{statistics.mean(v):.4f} ± {statistics.pstdev(v):.4f}")
        lines.append(f"| {st} | " + " | ".join(vals) + " |")
    lines.append("\nGap to FP32-master mixed precision at the same learning rate (mean over seeds):\n")
    lines.append("| strategy | " + " | ".join(f"lr {lr:g}" for lr in args.lrs) + " |")
    lines.append("|---|" + "---|" * len(args.lrs))
    for st in ("bf16_sr", "bf16_nearest"):
        gaps = [statistics.mean(table[st][str(lr)]) - statistics.mean(table["master"][str(lr)]) for lr in args.lrs]
        lines.append(f"| {st} | " + " | ".join(f"{g:+.4f}" for g in gaps) + " |")
    write_result("cpu-optim-quality", result, "\n".join(lines) + "\n")


# ---- memory -----------------------------------------------------------------------------------

# Persistent bytes per parameter: weights, gradient, optimizer state (excluding activations).
ANALYTIC = {
    "master (FP32 params + AdamW, BF16 autocast copies)": {"weights": 4, "grad": 4, "m+v": 8},
    "Megatron-style (BF16 weights + FP32 master + BF16 grads)": {"weights": 2, "master": 4, "grad": 2, "m+v": 8},
    "bf16_sr / bf16_nearest, FP32 moments": {"weights": 2, "grad": 2, "m+v": 8},
    "bf16_sr, BF16 moments": {"weights": 2, "grad": 2, "m+v": 4},
}


def _measured_bytes(weights: str, state_dtype: torch.dtype) -> dict:
    from snip_ops.optim import AdamW
    from snip_train.model import Llama, LlamaConfig

    torch.manual_seed(0)
    dtype = torch.float32 if weights == "fp32" else torch.bfloat16
    model = Llama(LlamaConfig.preset("small")).to(dtype)
    params = list(model.parameters())
    opt = (torch.optim.AdamW(params, lr=1e-3) if weights == "fp32"
           else AdamW(params, lr=1e-3, state_dtype=state_dtype))
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    n = sum(p.numel() for p in params)
    state = sum(t.nbytes for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor))
    return {"params": n, "weights": sum(p.nbytes for p in params) / n, "grad": sum(p.grad.nbytes for p in params) / n,
            "optimizer_state": state / n,
            "total": (sum(p.nbytes + p.grad.nbytes for p in params) + state) / n}


def memory(args) -> None:
    measured = {
        "master (FP32 params + torch AdamW)": _measured_bytes("fp32", torch.float32),
        "bf16_sr, FP32 moments": _measured_bytes("bf16_sr", torch.float32),
        "bf16_sr, BF16 moments": _measured_bytes("bf16_sr", torch.bfloat16),
    }
    result = {**provenance("python bench/bench_optim.py memory"), "analytic_bytes_per_param": ANALYTIC,
              "measured_bytes_per_param": measured,
              "method": "measured: tensor bytes of parameters, gradients and optimizer state (step counters "
                        "included) of the 'small' Llama after one step, divided by the parameter count"}
    lines = ["# BF16 + SR AdamW: memory per parameter\n", f"- date {result['date']}, commit {result['commit']}",
             "- command: `python bench/bench_optim.py memory`", f"- {result['method']}\n",
             "| strategy (analytic) | bytes / param | breakdown |", "|---|---|---|"]
    for name, parts in ANALYTIC.items():
        lines.append(f"| {name} | {sum(parts.values())} | " + ", ".join(f"{k} {v}" for k, v in parts.items()) + " |")
    lines += ["", f"| strategy (measured, {next(iter(measured.values()))['params'] / 1e6:.1f}M params) | "
              "weights | grad | optimizer state | total |", "|---|---|---|---|---|"]
    for name, m in measured.items():
        lines.append(f"| {name} | {m['weights']:.2f} | {m['grad']:.2f} | {m['optimizer_state']:.2f} | {m['total']:.2f} |")
    base = measured["master (FP32 params + torch AdamW)"]["total"]
    lines.append(f"\nbf16_sr with FP32 moments saves {1 - measured['bf16_sr, FP32 moments']['total'] / base:.0%} of "
                 f"the persistent training memory of the FP32-master layout, with BF16 moments "
                 f"{1 - measured['bf16_sr, BF16 moments']['total'] / base:.0%}.")
    write_result("cpu-optim-memory", result, "\n".join(lines) + "\n")


# ---- GPU step time ----------------------------------------------------------------------------


def gpu(args) -> None:
    from cuda_timer import CudaTimer
    from gpu_bench import write_device_result
    from snip_ops.optim import AdamW

    if not torch.cuda.is_available():
        sys.exit("bench_optim gpu: needs a CUDA GPU")
    dev = torch.device("cuda")
    timer = CudaTimer(args.warmup, args.iters)
    # a 1B-parameter set of tensors with Llama-1B-like shapes
    shapes = [(2048, 2048)] * 4 * 16 + [(8192, 2048)] * 3 * 16 + [(32000, 2048)] * 2
    n = sum(a * b for a, b in shapes)
    entries = []

    def tensors(dtype):
        ps = [torch.nn.Parameter(torch.randn(s, device=dev, dtype=dtype) * 0.02) for s in shapes]
        for p in ps:
            p.grad = torch.randn_like(p) * 1e-3
        return ps

    # device copy bandwidth: read + write of a 2 GiB buffer
    src = torch.empty(2**30, dtype=torch.bfloat16, device=dev)
    dst = torch.empty_like(src)
    t = timer(lambda: dst.copy_(src))
    copy_bw = 2 * src.nbytes / t
    del src, dst
    entries.append({"name": "device copy", "seconds": t, "bandwidth_GBps": copy_bw / 1e9})

    for state_dtype, bytes_per in ((torch.float32, 2 * 2 + 2 + 4 * 4), (torch.bfloat16, 2 * 2 + 2 + 2 * 4)):
        ps = tensors(torch.bfloat16)
        opt = AdamW(ps, lr=1e-4, state_dtype=state_dtype, implementation="kernel")
        t = timer(opt.step)
        entries.append({"name": f"snip AdamW bf16 SR, {str(state_dtype)[6:]} moments", "seconds": t,
                        "bytes_moved": bytes_per * n, "bandwidth_fraction_of_copy": bytes_per * n / t / copy_bw})
        del ps, opt
        torch.cuda.empty_cache()

    master = tensors(torch.float32)
    bf16 = [p.detach().to(torch.bfloat16) for p in master]
    opt = torch.optim.AdamW(master, lr=1e-4, fused=True)

    def torch_step():
        opt.step()
        torch._foreach_copy_(bf16, master)

    t = timer(torch_step)
    entries.append({"name": "torch.optim.AdamW(fused=True) on FP32 master + BF16 copy", "seconds": t,
                    "bytes_moved": (4 * 2 + 4 + 8 * 2 + 4 + 2) * n})
    name = torch.cuda.get_device_name()
    result = {**provenance("python bench/bench_optim.py gpu"), "device": name, "params": n, "entries": entries,
              "method": f"CUDA events, L2 flushed, median of {args.iters} after {args.warmup} warm-up steps"}
    write_device_result(result, "optim")
    print(json.dumps(result, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    q = sub.add_parser("quality")
    q.add_argument("--steps", type=int, default=200)
    q.add_argument("--seeds", type=int, default=3)
    q.add_argument("--lrs", type=lambda s: [float(x) for x in s.split(",")], default=[1e-4, 3e-4, 1e-3])
    q.add_argument("--workers", type=int, default=2)
    sub.add_parser("memory")
    g = sub.add_parser("gpu")
    g.add_argument("--warmup", type=int, default=3)
    g.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    {"quality": quality, "memory": memory, "gpu": gpu}[args.what](args)


if __name__ == "__main__":
    main()
