"""Build driver: metadata lives in pyproject.toml, the native build in CMakeLists.txt.

The extension snip_ops._C is built with its CUDA kernels when torch is a CUDA build and nvcc is
found. Otherwise, or with SNIP_NO_CUDA=1, it is built without CUDA: the CPU implementations of the
ops (quantize, dequantize, adamw_: host loops of the kernels' arithmetic, bit-identical to the
reference), which need only a C++ compiler and cmake. SNIP_NO_EXT=1 (or no C++ compiler) makes the
install pure Python: snip_ops then runs its PyTorch reference implementations. Install with
`pip install --no-build-isolation -e .` so the build sees the installed torch instead of
downloading another one.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
MIN_CMAKE = (3, 26)


def _truthy(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def find_cuda_home():
    """CUDA_HOME/CUDA_PATH, else /usr/local/cuda, else the parent of `nvcc` on PATH.

    torch's own guess is not used: an `nvcc` wrapper script outside the toolkit misleads it.
    """
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and (Path(home) / "bin" / "nvcc").exists():
            return Path(home)
    if Path("/usr/local/cuda/bin/nvcc").exists():
        return Path("/usr/local/cuda")
    nvcc = shutil.which("nvcc")
    return Path(nvcc).resolve().parent.parent if nvcc else None


def find_cxx():
    """The C++ compiler CMake would pick first (CXX, else c++ / g++ / clang++ on PATH), or None."""
    for exe in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if exe and shutil.which(exe.split()[0]):
            return exe
    return None


def build_plan():
    """(with_cuda, None) when the extension is built, with or without its CUDA kernels, else
    (False, why it is not built); prints why a build goes without CUDA."""
    if _truthy("SNIP_NO_EXT"):
        return False, "SNIP_NO_EXT is set"
    try:
        import torch
    except ImportError as e:
        return False, f"torch is not importable at build time ({e}); use pip install --no-build-isolation"
    if _truthy("SNIP_NO_CUDA"):
        no_cuda = "SNIP_NO_CUDA is set"
    elif torch.version.cuda is None:
        no_cuda = f"torch {torch.__version__} is a CPU-only build"
    elif find_cuda_home() is None:
        no_cuda = "nvcc not found (set CUDA_HOME)"
    else:
        return True, None
    if find_cxx() is None:
        return False, f"{no_cuda} and there is no C++ compiler for the CPU implementations"
    print(f"snip: building snip_ops._C without CUDA ({no_cuda}): the CPU implementations only", flush=True)
    return False, None


def _version(exe):
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def find_cmake():
    candidates = []
    try:  # the PyPI `cmake` package, even when its script dir is not on PATH
        import cmake

        candidates.append(str(Path(cmake.CMAKE_BIN_DIR) / "cmake"))
    except ImportError:
        pass
    candidates.append(shutil.which("cmake"))
    for exe in candidates:
        if exe and Path(exe).exists() and _version(exe) >= MIN_CMAKE:
            return exe
    raise RuntimeError(
        f"snip: building the extension needs cmake >= {MIN_CMAKE[0]}.{MIN_CMAKE[1]} "
        "(pip install 'cmake>=4' ninja), or set SNIP_NO_EXT=1 for a pure-Python install"
    )


def find_ninja():
    try:
        import ninja

        exe = Path(ninja.BIN_DIR) / "ninja"
        if exe.exists():
            return str(exe)
    except ImportError:
        pass
    return shutil.which("ninja")


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configure + build CMakeLists.txt, then copy the module to where setuptools expects it
    (inside snip_ops/ for editable installs)."""

    def build_extension(self, ext):
        cuda_home = find_cuda_home() if WITH_CUDA else None
        cmake = find_cmake()
        ninja = find_ninja()
        # A fixed build dir per interpreter (and per CUDA / CPU-only build) keeps rebuilds incremental
        # across pip invocations.
        env_tag = hashlib.sha1(sys.prefix.encode()).hexdigest()[:8]
        kind = "" if WITH_CUDA else "-cpu"
        build_dir = ROOT / "build" / f"cmake-py{sys.version_info[0]}{sys.version_info[1]}-{env_tag}{kind}"
        out_dir = build_dir / "out"
        args = [
            f"-DPython_EXECUTABLE={sys.executable}",
            f"-DSNIP_WITH_CUDA={'ON' if WITH_CUDA else 'OFF'}",
            f"-DSNIP_OUTPUT_DIR={out_dir}",
            f"-DCMAKE_BUILD_TYPE={os.environ.get('SNIP_BUILD_TYPE', 'Release')}",
        ]
        env = dict(os.environ)
        if WITH_CUDA:
            args += [f"-DCMAKE_CUDA_COMPILER={cuda_home / 'bin' / 'nvcc'}", f"-DCUDAToolkit_ROOT={cuda_home}"]
            # Always explicit, so a value cached by an earlier build with other archs cannot linger.
            args.append(f"-DSNIP_CUDA_ARCHS={os.environ.get('SNIP_CUDA_ARCHS') or '90a;100a'}")
            env["CUDA_HOME"] = str(cuda_home)
        cache = build_dir / "CMakeCache.txt"
        if ninja and not (cache.exists() and "Unix Makefiles" in cache.read_text()):
            args += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"]
        jobs = os.environ.get("MAX_JOBS") or str(os.cpu_count() or 1)
        what = f"CUDA {cuda_home}" if WITH_CUDA else "without CUDA"
        print(f"snip: building snip_ops._C with {cmake} ({what}, -j{jobs})", flush=True)
        subprocess.run([cmake, "-S", str(ROOT), "-B", str(build_dir), *args], check=True, env=env)
        subprocess.run([cmake, "--build", str(build_dir), "-j", jobs], check=True, env=env)

        built = sorted(out_dir.glob("_C*.so"), key=lambda p: p.stat().st_mtime)
        if not built:
            raise RuntimeError(f"snip: CMake produced no _C*.so in {out_dir}")
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.copyfile(built[-1], tmp)
        os.replace(tmp, dest)  # atomic: a process that has the old module mapped keeps it intact


WITH_CUDA, _reason = build_plan()
if _reason:
    print(f"snip: not building the extension: {_reason}; installing pure Python", flush=True)
    # An editable install would otherwise keep importing a stale module from an earlier build.
    for stale in (ROOT / "snip_ops").glob("_C*.so"):
        stale.unlink()

setup(
    ext_modules=[] if _reason else [CMakeExtension("snip_ops._C")],
    cmdclass={"build_ext": CMakeBuild},
)
