"""Code that only a GPU runs never executes in CI: the gpu-marked tests (skipped without a device),
`snip doctor`, the GPU benchmarks' kernel branches. Its calls are checked statically instead, with
pylint's call checks, which have no false positives on this tree: a keyword that repeats an argument
given by position, a missing or extra argument, an undefined name. A test helper given its bound's
path by position and again as qgemm's keyword failed 10 GEMM tests on the first H100 run that reached
them; this check flags the call behind 8 of them (pylint cannot see through the other call's
`*operands(...)`)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKS = {
    "E1120": "no-value-for-parameter",
    "E1121": "too-many-function-args",
    "E1124": "redundant-keyword-arg",
    "E0602": "undefined-variable",
}
GPU_ONLY_MODULES = ["bench/bench_gemm.py", "bench/bench_quant.py", "bench/bench_optim.py", "snip_train/doctor.py",
                    "snip_ops/self_check.py"]


def gpu_test_modules() -> list[str]:
    """Every test module with a gpu-marked test."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "pytest.mark.gpu" in p.read_text())


def pylint(paths: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pylint", "--disable=all", f"--enable={','.join(CHECKS)}",
                           "--score=n", *paths], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_gpu_only_code_has_no_bad_calls():
    pytest.importorskip("pylint")
    modules = gpu_test_modules()
    assert "tests/ops/test_gemm_kernels_gpu.py" in modules and len(modules) >= 8
    result = pylint(modules + GPU_ONLY_MODULES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_catches_a_repeated_keyword(tmp_path):
    pytest.importorskip("pylint")
    bad = tmp_path / "bad.py"
    bad.write_text("def check(a, path, **kw):\n    return a, path, kw\n\n\ncheck(1, 'sm90_fp8', path='sm90_fp8')\n")
    result = pylint([str(bad)])
    assert result.returncode != 0 and "redundant-keyword-arg" in result.stdout
