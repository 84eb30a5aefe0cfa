"""One training step of the small Llama-like model on the CPU: every projection (q, k, v, o, gate, up,
down; lm_head stays high precision, as `snip_ops.convert` and `snip train` leave it) in emulated FP4
(the "fp4" recipe: E2M1 with 1x128 / 128x128 FP32-scaled blocks, stochastically rounded gradients)
against the same model in "bf16" (plain nn.Linear, float32 on the CPU), on the same batches; the
ratio of the median step times, measured in one run with the two kinds of step interleaved.

    python -m bench.bench_cpu_step                          # the quantizer op (CPU implementation)
    python -m bench.bench_cpu_step --quantizer reference    # the PyTorch reference quantizer
    python -m bench.bench_cpu_step --profile                # + where an FP4 step's time goes
    python -m bench.bench_cpu_step --smoke                  # seconds (tests/bench/test_bench_smoke.py)

A step: forward, loss, backward, gradient clipping, AdamW; after `--warmup` steps of each kind,
`--steps` of each are timed. `--quantizer op` quantizes with snip_C::quantize's CPU implementation
where the extension has it (what snip_ops.linear does by default); `reference` emulates the GEMMs
with the PyTorch reference quantizer (`emulate=True`, the only CPU path without the extension). Both
compute the same numbers. Writes <results>/cpu-step-<quantizer>.json and .md.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.run_record import RESULTS, provenance, write_result
from snip_ops import _ext, convert
from snip_train.model import Llama, LlamaConfig


def _models(cfg: LlamaConfig, quantizer: str) -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    base = Llama(cfg)
    fp4 = convert(copy.deepcopy(base), plan="fp4", emulate=quantizer == "reference")
    return {"bf16": base, "fp4": fp4}


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: torch.Tensor) -> float:
    loss = model.loss(batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    cfg = LlamaConfig.preset(args.preset)
    seq = args.seq_len or cfg.max_seq_len
    models = _models(cfg, args.quantizer)
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1) for k, m in models.items()}
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, cfg.vocab_size, (args.batch_size, seq + 1), generator=gen)
               for _ in range(args.warmup + args.steps)]
    times: dict[str, list[float]] = {k: [] for k in models}
    losses: dict[str, list[float]] = {k: [] for k in models}
    for i, batch in enumerate(batches):
        for kind, model in models.items():  # interleaved: both kinds see the same machine load
            t0 = time.perf_counter()
            losses[kind].append(_step(model, opts[kind], batch))
            if i >= args.warmup:
                times[kind].append(time.perf_counter() - t0)
    median = {k: statistics.median(v) for k, v in times.items()}
    result = {"quantizer": args.quantizer, "quantize_op_on_cpu": _ext.kernel_available("quantize", "cpu"),
              "preset": args.preset, "batch_size": args.batch_size, "seq_len": seq, "warmup": args.warmup,
              "steps": args.steps, "step_s": times, "median_step_s": median, "ratio": median["fp4"] / median["bf16"],
              "losses": losses}
    if args.profile:
        result["profile"] = _profile(models["fp4"], opts["fp4"], batches[-1])
    return result


def _profile(model, opt, batch) -> str:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            _step(model, opt, batch)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quantizer", choices=("op", "reference"), default="op")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=None, help="default: the preset's max_seq_len")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=15, help="timed steps of each kind")
    p.add_argument("--profile", action="store_true", help="torch.profiler table of three FP4 steps")
    p.add_argument("--smoke", action="store_true", help="seconds: batch 2 x 16, 1 + 2 steps")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if args.smoke:
        args.batch_size, args.seq_len, args.warmup, args.steps = 2, 16, 1, 2
    command = "python -m bench.bench_cpu_step " + " ".join(argv if argv is not None else sys.argv[1:])
    result = {**provenance(command.strip()), "threads": torch.get_num_threads(), **run(args)}
    med = result["median_step_s"]
    on_op = args.quantizer == "op" and result["quantize_op_on_cpu"]
    lines = [f"# One training step on the CPU: emulated FP4 vs bf16 ({args.quantizer} quantizer)\n",
             f"- date {result['date']}, commit {result['commit']}, torch {result['torch']}",
             f"- command: `{result['command']}`",
             f"- {result['cpus']} cores, {args.threads} intra-op thread(s), load at start "
             f"{result['loadavg_at_start'][0]:.1f}; model {args.preset}, batch {args.batch_size} x "
             f"{result['seq_len']} tokens; median of {args.steps} steps after {args.warmup} warm-up, interleaved",
             f"- every projection \"fp4\" (E2M1, SR gradients) vs plain nn.Linear; quantizer: "
             f"{'snip_C::quantize on the CPU' if on_op else 'the PyTorch reference'}\n",
             "| step | median (ms) | min (ms) |", "|---|---|---|"]
    for kind in ("bf16", "fp4"):
        lines.append(f"| {kind} | {1e3 * med[kind]:.1f} | {1e3 * min(result['step_s'][kind]):.1f} |")
    lines.append(f"\n**FP4 / bf16 step time: {result['ratio']:.2f}x**\n")
    if args.profile:
        lines += ["Three FP4 steps under torch.profiler (self CPU time):\n", "```", result["profile"], "```"]
    write_result(f"cpu-step-{args.quantizer}", result, "\n".join(lines) + "\n", args.results)


if __name__ == "__main__":
    main()
