"""Where a call's time goes: the device time of each kernel it launches (torch.profiler), beside its host
time, so that a benchmark entry says whether it is bound by the GPU's kernels or by the host's launches.

    from bench.kernel_profile import kernel_profile
    kernel_profile(call, calls=3)  # -> {"calls", "host_us_per_call", "device_us_per_call", "kernels": [...]}

Per kernel (the `top` longest by device time, summed over the profiled calls): its name (cut to 120
characters), launches per call and device microseconds per call. Without a CUDA device the kernel list is
empty and the host time is the CPU's: the code runs, nothing GPU-side is measured.
"""

from __future__ import annotations

import time

import torch


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def kernel_profile(call, calls: int = 3, top: int = 12) -> dict:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    call()  # outside the profile: first-call work (allocations, a tuning run) is not the steady state
    _sync()
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        host = time.perf_counter() - t0  # launches only: the device may still be running
        _sync()
    kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0]
    kernels.sort(key=lambda e: e.self_device_time_total, reverse=True)
    device_us = sum(e.self_device_time_total for e in kernels)
    return {
        "calls": calls,
        "host_us_per_call": host / calls * 1e6,
        "device_us_per_call": device_us / calls,
        "kernels": [{"name": e.key[:120], "launches_per_call": e.count / calls,
                     "device_us_per_call": e.self_device_time_total / calls} for e in kernels[:top]],
    }
