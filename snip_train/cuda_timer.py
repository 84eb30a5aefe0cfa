"""GPU timing shared by `snip doctor` and the kernel benchmarks: CUDA events around each call, the L2
cache flushed (a 256 MiB buffer zeroed) before every call, median over `iters` calls after `warmup`
calls. The flush also keeps the GPU busy while the host issues the call, so that the time is the
GPU's and not the host's dispatch of a short call (which a synchronize after every call measures)."""

from __future__ import annotations

import statistics

import torch


class CudaTimer:
    def __init__(self, warmup: int, iters: int):
        self.warmup, self.iters = warmup, iters
        self.flush_buf = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int32, device="cuda")

    def __call__(self, fn) -> float:
        """Median seconds of fn() with a cold L2."""
        for _ in range(self.warmup):
            fn()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.iters)]
        for s, e in zip(starts, ends):
            self.flush_buf.zero_()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) / 1e3
