"""Run a test body on two gloo ranks, each in its own spawned process (CPU, one thread each)."""

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, port, fn, args, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        results[rank] = fn(rank, *args)
    finally:
        dist.destroy_process_group()


def run_on_ranks(fn, *args) -> list:
    """[fn(0, *args), fn(1, *args)], each called inside an initialised process group. `fn` must be a
    module-level function and its result picklable."""
    results = mp.Manager().dict()
    mp.start_processes(_entry, args=(_free_port(), fn, args, results), nprocs=WORLD, join=True, start_method="spawn")
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
