"""The extension built without CUDA (what a machine without nvcc or with a CPU-only torch gets):
CMake with SNIP_WITH_CUDA=OFF into a scratch build directory, the module dropped into a copy of
snip_ops, and a fresh interpreter that checks it holds the CPU implementations only and that they
quantize bit for bit like the reference. Needs cmake and a C++ compiler (CI has both; the build
directory lives under build/ so that a second run is incremental)."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from native_build import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "build" / f"cpu-only-test-py{sys.version_info[0]}{sys.version_info[1]}"

CHECK = textwrap.dedent("""
    import torch
    from snip_ops import _ext, reference
    from snip_ops.formats import RECIPES
    from snip_ops.quantize import dequantize, quantize

    assert _ext.HAS_KERNELS, _ext.build_info()
    assert _ext.compiled_archs() == [], _ext.compiled_archs()
    assert set(_ext.kernels()) == {"quantize", "dequantize", "e2m1_as_e4m3", "adamw"}, _ext.kernels()
    assert _ext.kernel_available("quantize", "cpu") and _ext.kernel_available("dequantize", "cpu")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(130, 200, generator=g) * torch.logspace(-4, 4, 200)
    for name, r in RECIPES.items():
        for spec in {s for s in (r.act, r.weight, r.grad) if s is not None}:
            for transpose in (False, True):
                q = quantize(x, spec, seed=1, offset=2, transpose=transpose)
                ref = reference.quantize(x, spec, seed=1, offset=2, transpose=transpose)
                assert torch.equal(q.codes.view(torch.uint8), ref.codes.view(torch.uint8)), (name, spec)
                assert torch.equal(q.scales.view(torch.uint8), ref.scales.view(torch.uint8)), (name, spec)
                assert torch.equal(dequantize(q).view(torch.int32), reference.dequantize(ref).view(torch.int32))
    print("cpu-only build ok")
""")


def _tool(name: str) -> str | None:
    if name == "cmake":
        try:
            import cmake

            return str(Path(cmake.CMAKE_BIN_DIR) / "cmake")
        except ImportError:
            pass
    return shutil.which(name)


def test_cpu_only_extension_builds_and_matches_the_reference(tmp_path):
    cmake = _tool("cmake")
    if cmake is None or not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        skip_or_fail("the CPU-only build needs cmake and a C++ compiler")
    out = BUILD / "out"
    args = [f"-DPython_EXECUTABLE={sys.executable}", "-DSNIP_WITH_CUDA=OFF", f"-DSNIP_OUTPUT_DIR={out}",
            "-DCMAKE_BUILD_TYPE=Release"]
    ninja, cache = _tool("ninja"), BUILD / "CMakeCache.txt"
    if ninja and not (cache.exists() and "Unix Makefiles" in cache.read_text()):
        args += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    for cmd in ([cmake, "-S", str(ROOT), "-B", str(BUILD), *args], [cmake, "--build", str(BUILD), "-j", "2"]):
        run = subprocess.run(cmd, capture_output=True, text=True, env=env)
        assert run.returncode == 0, f"{' '.join(cmd)}\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    built = sorted(out.glob("_C*.so"), key=lambda p: p.stat().st_mtime)
    assert built, f"no _C*.so in {out}"

    package = tmp_path / "snip_ops"
    shutil.copytree(ROOT / "snip_ops", package, ignore=shutil.ignore_patterns("_C*.so", "__pycache__"))
    shutil.copyfile(built[-1], package / built[-1].name)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert run.returncode == 0 and "cpu-only build ok" in run.stdout, run.stdout + run.stderr
