"""All-gather bytes of FSDP2 training steps with SnipLinear weights gathered quantized (snip_ops.fsdp).

    python -m bench.bench_fsdp_all_gather [--layers 4] [--width 1024] [--steps 3] [--results DIR]

Two gloo ranks (spawned CPU processes) train a stack of bias-free `width` x `width` SnipLinear layers,
each `fully_shard`-ed, for `steps` steps and count the bytes each rank puts into FSDP2's all-gathers
(`torch.distributed.all_gather_single`, forward and backward) per step. Baselines: the ordinary
full-precision gather of FP32 parameters and of BF16 ones (`MixedPrecisionPolicy(param_dtype=bf16)`,
the layer then quantizing the gathered BF16 weight); the quantized gathers run under the same BF16
policy, so their weight codes come from the same BF16 values. Writes
bench/results/cpu-fsdp-all-gather.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from bench.run_record import RESULTS, provenance

WORLD = 2
# name: (plan, FSDP param dtype, low-precision all-gather)
CONFIGS = {
    "fp32 params, full-precision gather": ("fp8", None, False),
    "bf16 params, full-precision gather": ("fp8", torch.bfloat16, False),
    "fp8 (E4M3, 128x128 FP32 scales)": ("fp8", torch.bfloat16, True),
    "fp4 (E2M1, 128x128 FP32 scales)": ("fp4", torch.bfloat16, True),
    "nvfp4_train (E2M1, 16x16 E4M3 scales + FP32 tensor scale)": ("nvfp4_train", torch.bfloat16, True),
}
BASELINE = "bf16 params, full-precision gather"


def _bytes_per_step(rank: int, plan: str, param_dtype, low_precision: bool, layers: int, width: int,
                    steps: int) -> list[int]:
    import snip_ops
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = snip_ops.convert(nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers))), plan)
    if low_precision:
        snip_ops.fsdp.enable_low_precision_all_gather(model)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype)
    for layer in model:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(rank)
    counted = [0]
    all_gather_single = dist.all_gather_single

    def counting(output, input, *args, **kwargs):
        counted[0] += input.numel() * input.element_size()
        return all_gather_single(output, input, *args, **kwargs)

    dist.all_gather_single = counting
    per_step = []
    try:
        for _ in range(steps):
            counted[0] = 0
            loss = model(torch.randn(16, width, generator=gen)).float().pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            per_step.append(counted[0])
    finally:
        dist.all_gather_single = all_gather_single
    return per_step


def _rank(rank: int, store_path: str, args: argparse.Namespace, results) -> None:
    torch.set_num_threads(1)
    # A file store: no rank hosts a TCP store server, and no port is picked and then raced for.
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
    try:
        for name, (plan, param_dtype, low) in CONFIGS.items():
            results[(rank, name)] = _bytes_per_step(rank, plan, param_dtype, low, args.layers, args.width, args.steps)
        dist.barrier()  # neither rank tears down while the other still has collectives in flight
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.width % (WORLD * 128):
        parser.error(f"--width must be a multiple of {WORLD * 128} so that every shard holds whole 128-row blocks")
    results = mp.Manager().dict()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        mp.start_processes(_rank, args=(store, args, results), nprocs=WORLD, join=True, start_method="spawn")
    seconds = time.perf_counter() - start
    for name in CONFIGS:  # every step gathers the same layouts, and both ranks the same amounts
        counts = {b for r in range(WORLD) for b in results[(r, name)]}
        if len(counts) != 1:
            raise RuntimeError(f"{name}: all-gather bytes differ between steps or ranks: {sorted(counts)}")
    per_step = {name: results[(0, name)][0] for name in CONFIGS}
    params = args.layers * args.width * args.width
    command = "python -m bench.bench_fsdp_all_gather" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    info = provenance(command)
    rows = "\n".join(f"| {name} | {b:,} | {b / (params / WORLD) / 2:.4f} | {per_step[BASELINE] / b:.3f}x |"
                     for name, b in per_step.items())
    md = f"""# FSDP2 all-gather bytes with quantized SnipLinear weights

- date {info['date']}, commit {info['commit']}
- command: `{command}` ({WORLD} gloo ranks on the CPU, {seconds:.1f} s including the process spawns)
- model: {args.layers} bias-free {args.width}x{args.width} SnipLinear layers ({params:,} weights), each
  `fully_shard`-ed; {args.steps} AdamW steps; every step all-gathers each layer twice (forward, and again
  for backward after the forward reshard)
- measured: bytes each rank passes to `torch.distributed.all_gather_single` per training step
  (identical on every step and both ranks); bytes / weight / gather: those divided by the rank's
  share of the weights and by the 2 gathers

| all-gather | bytes per step per rank | bytes / weight / gather | less than BF16 |
|---|---|---|---|
{rows}

The quantized gathers carry codes and block scales only: FP8 1 byte + 4/128^2 (FP32 scale) per weight,
FP4 0.5 + 4/128^2, nvfp4_train 0.5 + 1/16^2 (E4M3 scale; its FP32 tensor scale comes from a one-float
all-reduce (MAX) of the shards' amax, not gathered). The weights the layers compute with are bit for bit
those of quantizing after a full-precision gather (tests/ops/test_fsdp_all_gather.py).
"""
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "cpu-fsdp-all-gather.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
