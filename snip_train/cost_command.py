"""`snip cost`: the measured GEMM cost table of a model's linear layers on this device.

    snip cost --preset 1b --tokens 8192 --out cost.json
    snip train ... --planner --planner-budget cost=0.4 --planner-cost-table cost.json

For every distinct linear layer of the preset, each of its three GEMMs in each precision is timed as
training runs it -- both operands quantized from BF16, then the GEMM (snip_ops.gemm_timing) -- with the
FP8 kernel configs tuned on this GPU first (snip_ops.autotune, "tune" mode, its on-disk cache) unless
--no-tune. The table is planner.cost.MeasuredCost's: a 'cost=' budget then prices what this hardware
measured. On the CPU the times are those of the reference implementation: a smoke run, no price.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from .errors import UsageError, user_input
from .source_commit import git_commit

COST_HELP = "measure each linear-layer GEMM of a model preset on this device, quantization included (a cost table)"


def _precisions(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated precisions, e.g. bf16,fp8,fp4")
    return names


def add_cost_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help="model preset whose linear layers are measured (default: %(default)s)")
    p.add_argument("--tokens", type=int, default=8192,
                   help="tokens per training step (the GEMMs' M: batch x sequence) (default: %(default)s)")
    p.add_argument("--precisions", type=_precisions, default=["bf16", "fp8", "fp4"], metavar="P,P",
                   help="precisions to time (default: bf16,fp8,fp4)")
    p.add_argument("--no-tune", action="store_true",
                   help="use the committed tuning table instead of timing the FP8 kernel configs first")
    p.add_argument("--device", default="auto", metavar="{auto,cpu,cuda}", help="(default: %(default)s)")
    p.add_argument("--out", type=Path, required=True, metavar="JSON", help="where the cost table goes")


def provenance(args: argparse.Namespace) -> dict:
    """When, by which command and at which commit (None outside a git checkout) the table was made."""
    command = (f"snip cost --preset {args.preset} --tokens {args.tokens} --precisions {','.join(args.precisions)}"
               + (" --no-tune" if args.no_tune else "") + f" --device {args.device} --out {args.out.name}")
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "command": command,
            "commit": git_commit()}


def layer_dims(preset: str, tokens: int) -> list[tuple[int, int, int]]:
    """(M, N, K) of each distinct nn.Linear of the preset, M = `tokens` (built on the meta device)."""
    import torch

    from .model import Llama, LlamaConfig

    with torch.device("meta"):
        model = Llama(LlamaConfig.preset(preset))
    dims = {(tokens, m.out_features, m.in_features) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    return sorted(dims)


def run_cost_command(args: argparse.Namespace) -> int:
    from planner import MeasuredCost
    from snip_ops import autotune, gemm_timing
    from snip_ops.formats import recipe

    from .train import resolve_device

    if args.tokens < 1:
        raise UsageError(f"--tokens must be >= 1, got {args.tokens}")
    for p in args.precisions:
        with user_input(f"--precisions {p}"):
            recipe(p)
    with user_input("--preset"):
        dims = layer_dims(args.preset, args.tokens)
    device = resolve_device(args.device)
    previous = autotune.configure(autotune.TuningConfig(mode="table" if args.no_tune else "tune"))
    try:
        with user_input("--precisions"):
            table = gemm_timing.measure(dims, args.precisions, device)
    finally:
        autotune.configure(previous)
    table = dict(provenance(args), **table, preset=args.preset, tokens=args.tokens)
    MeasuredCost.from_json(table)  # what --planner-cost-table will read
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(table, indent=1) + "\n")
    print(f"snip cost: {len(table['entries'])} GEMM times of {len(dims)} layer shapes on {table['device']} "
          f"-> {args.out}")
    return 0
