"""What the native test libraries (tests/host_twin.py, tests/cuda_host.py, tests/cutlass_host.py)
share: finding the compilers and the CUDA headers, skipping the calling test where they are missing
(failing it where the build requires the extension, SNIP_REQUIRE_EXT=1, set by CI when nvcc exists),
and a cache of built libraries, each keyed by a hash of everything that goes into it."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest


def skip_or_fail(why: str) -> NoReturn:
    if os.environ.get("SNIP_REQUIRE_EXT") == "1":  # CI where nvcc exists: never skip these checks
        pytest.fail(why)
    pytest.skip(why)


def cuda_include() -> Path | None:
    """The CUDA toolkit's include directory (the one with cuda_fp8.h), None without one."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for home in filter(None, homes):
        if (Path(home) / "include" / "cuda_fp8.h").exists():
            return Path(home) / "include"
    return None


def host_toolchain(why: str) -> tuple[str, Path]:
    """(the C++ compiler, the CUDA include directory); skips or fails the calling test with `why`
    where either is missing."""
    cxx = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    include = cuda_include()
    if cxx is None or include is None:
        skip_or_fail(why)
    return cxx, include


def cached_library(stem: str, key: bytes, build: Callable[[Path], None],
                   cache: Path = Path(tempfile.gettempdir())) -> Path:
    """`cache`/<stem>_<hash of key>.so, first built with `build(path)` where it is missing. One build
    per stem at a time: other processes wait, then reuse it. `build` writes a temporary path, renamed
    once complete, so that no process loads a half-written library."""
    lib = cache / f"{stem}_{hashlib.sha256(key).hexdigest()[:16]}.so"
    if lib.exists():
        return lib
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f"{stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not lib.exists():
            tmp = lib.with_suffix(f".{os.getpid()}.tmp")
            build(tmp)
            os.replace(tmp, lib)
    return lib
