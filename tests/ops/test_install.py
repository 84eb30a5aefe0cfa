"""Installs say what they built: `pip install .` as users type it (with pip's build isolation, which
hides the installed torch from the build) stops with the command that works instead of installing a
kernel-less snip; a pure-Python install happens only when SNIP_NO_EXT=1 asks for it; and the first use
of a kernel on a CUDA device that has none compiled warns once, naming the cause, the path taken and the
fix (the device faked here: the extension hidden, or built for other archs)."""

import json
import os
import shutil
import site
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from snip_ops import _ext

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A new virtual environment that sees this one's packages (torch among them, as a user's would have
    it) through a path file: their own path files, this tree's editable install among them, stay unread."""
    path = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    python = path / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "outer_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return python


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A copy of what an install reads (no build outputs, no results): pip writes its build files into
    the tree it installs, and this tree's editable install must not see them."""
    tree = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "setup.py", "CMakeLists.txt", "README.md"):
        shutil.copy2(ROOT / name, tree / name)
    for package in ("snip_ops", "planner", "snip_train", "csrc"):
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return tree


def _pip(python: Path, source: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("SNIP_NO_EXT", "SNIP_NO_CUDA", "PYTHONPATH")}
    return subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-deps", *args],
                          cwd=source, env={**environ, **env}, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("editable", [False, True], ids=["pip install .", "pip install -e ."])
def test_an_isolated_build_stops_and_names_the_command_that_works(venv, source, editable):
    run = _pip(venv, source, *(["-e"] if editable else []), ".")
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-3000:]
    assert "torch is not importable where snip_ops._C is being built" in out, out[-3000:]
    assert "pip install --no-build-isolation" in out and "SNIP_NO_EXT=1" in out
    assert "Successfully installed" not in out


def test_a_pure_python_install_happens_when_asked_for_and_says_so(venv, source, tmp_path):
    (source / "snip_ops" / "_C.stale.so").write_bytes(b"")  # an earlier build's, which a wheel build leaves alone
    run = _pip(venv, source, "-v", ".", SNIP_NO_EXT="1")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "SNIP_NO_EXT is set: installing pure Python, without snip_ops._C (no kernels)" in out
    check = ("import json, snip_ops; from snip_ops import _ext; "
             "print(json.dumps([snip_ops.__file__, _ext.HAS_KERNELS, _ext.build_info()['extension_error']]))")
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    shown = subprocess.run([str(venv), "-c", check], cwd=tmp_path, env=environ, capture_output=True, text=True,
                           check=True).stdout
    where, has_kernels, why = json.loads(shown.splitlines()[-1])
    assert Path(where).resolve().is_relative_to(venv.parent.parent.resolve()), where  # the venv's copy
    assert has_kernels is False and "SNIP_NO_EXT=1" in why
    assert (source / "snip_ops" / "_C.stale.so").exists()


# ---- the first use on a CUDA device without kernels --------------------------------------------------------

@pytest.fixture
def fake_gpu(monkeypatch):
    """A CUDA device of the given arch, seen by _ext alone, and a fresh once-per-process record."""
    def use(arch: str, native: dict | None = None, error: str | None = None):
        monkeypatch.setattr(_ext, "_device_arch", lambda device: "cpu" if str(device) == "cpu" else arch)
        monkeypatch.setattr(_ext, "_warned", set())
        monkeypatch.setattr(_ext, "HAS_KERNELS", native is not None)
        monkeypatch.setattr(_ext, "_IMPORT_ERROR", error)
        monkeypatch.setattr(_ext, "_native_info", lambda: native or {})
    return use


def _first_use(kernel: str = "quantize") -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _ext.kernel_available(kernel, "cuda") is False
        assert _ext.kernel_available(kernel, "cuda") is False  # once per process and arch
        assert _ext.kernel_available("dequantize", "cuda") is False
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


PATH_TAKEN = "runs on the emulated PyTorch paths"


def test_no_extension_warns_once_with_the_cause_the_path_and_the_fix(fake_gpu):
    fake_gpu("sm_90a", error="snip_ops._C was not built: a pure-Python install (SNIP_NO_EXT=1 at install time)")
    [message] = _first_use()
    assert "no quantize kernel for this sm_90a GPU" in message and "SNIP_NO_EXT=1 at install time" in message
    # no quantizer either: snip_ops.linear runs fully emulated, its exact GEMMs in FP64
    assert PATH_TAKEN in message and "exact GEMMs in FP64" in message and "blockwise_bf16" not in message
    assert "pip install --no-build-isolation ." in message


def test_a_missing_gemm_kernel_beside_the_quantizer_names_the_bf16_fallback(fake_gpu):
    fake_gpu("sm_90a", native={"archs": ["sm_90a"], "kernels": {"quantize": ["sm_90a", "cpu"]}})
    [message] = _first_use("fp8_gemm_nt_blockwise")
    assert "lacks the fp8_gemm_nt_blockwise kernel" in message and PATH_TAKEN in message
    assert "BF16 tensor cores (blockwise_bf16 or bf16_exact)" in message and "FP64" not in message


def test_an_extension_for_other_archs_warns_with_the_arch_to_build(fake_gpu):
    fake_gpu("sm_90a", native={"archs": ["sm_100a"], "kernels": {"quantize": ["sm_100a", "cpu"]}})
    [message] = _first_use()
    assert "built for sm_100a only" in message and "including 90a" in message and PATH_TAKEN in message


def test_an_extension_without_cuda_warns(fake_gpu):
    fake_gpu("sm_100a", native={"archs": [], "kernels": {"quantize": ["cpu"], "dequantize": ["cpu"]}})
    [message] = _first_use()
    assert "built without CUDA" in message and "pip install --no-build-isolation ." in message


def test_a_gpu_snip_has_no_kernels_for_warns_without_a_fix_to_build(fake_gpu):
    fake_gpu("sm_89a", native={"archs": ["sm_90a"], "kernels": {"quantize": ["sm_90a", "cpu"]}})
    [message] = _first_use()
    assert "sm_90a (Hopper" in message and "nothing to build for this GPU" in message and PATH_TAKEN in message


def test_a_compiled_kernel_and_the_cpu_never_warn(fake_gpu):
    fake_gpu("sm_90a", native={"archs": ["sm_90a"], "kernels": {"quantize": ["sm_90a", "cpu"]}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _ext.kernel_compiled("quantize", "cuda") and _ext.kernel_compiled("quantize", "cpu")
        assert not _ext.kernel_compiled("dequantize", "cpu")
    assert not [w for w in caught if "no quantize kernel" in str(w.message)]
