"""Run a test body on two gloo ranks, each in its own spawned process (CPU, one thread each)."""

import faulthandler
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def _entry(rank, store_path, fn, args, results):
    # A crash inside torch's C++ (an abort from a collective or from process teardown) otherwise
    # reaches pytest as a bare signal number; this prints each thread's Python stack first.
    faulthandler.enable(all_threads=True)
    torch.set_num_threads(1)
    # A file store, not TCP: no rank hosts a store server thread that must outlive the other
    # rank's last request, and no port is picked and then raced for.
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD)
    try:
        results[rank] = fn(rank, *args)
        # No rank tears its process group down while the other still has collectives in flight.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_on_ranks(fn, *args) -> list:
    """[fn(0, *args), fn(1, *args)], each called inside an initialised process group. `fn` must be a
    module-level function and its result picklable."""
    results = mp.Manager().dict()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        mp.start_processes(_entry, args=(store_path, fn, args, results), nprocs=WORLD, join=True, start_method="spawn")
    return [results[r] for r in range(WORLD)]


def wrap(model: torch.nn.Sequential, wrapper: str) -> torch.nn.Module:
    """`model` under DDP ("ddp") or FSDP2 ("fsdp2": each nn.Linear, then the whole, fully_shard-ed)."""
    if wrapper == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)
