"""The AddressSanitizer build of the host shim (tests/cuda_host.py, scripts/asan_kernels.sh, CI's `asan` stage)
stops a kernel that writes outside its buffers, so that a clean run of the kernel tests under it means something.
Runs only in that build; elsewhere it skips."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import cuda_host

TESTS = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not cuda_host.ASAN,
                                reason="only in the AddressSanitizer build (scripts/asan_kernels.sh)")


def _selftest(name: str) -> subprocess.CompletedProcess:
    code = ("import sys, torch, cuda_host\n"
            "lib = cuda_host.load()\n"
            "out = torch.zeros(80, dtype=torch.int32)\n"
            f"sys.exit(lib.snip_cuda_host_selftest({name.encode()!r}, 1, out.data_ptr()))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)


def test_a_write_past_dynamic_shared_memory_stops_the_process():
    run = _selftest("dynamic_shared_memory_overrun")
    assert run.returncode != 0
    assert "AddressSanitizer: heap-buffer-overflow" in run.stderr and "dynamic_shared_memory_overrun" in run.stderr


def test_the_same_kernel_within_its_memory_runs():
    run = _selftest("neighbour_through_dynamic_shared_memory")
    assert run.returncode == 0, run.stderr[-2000:]
