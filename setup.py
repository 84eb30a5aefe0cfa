"""Build driver: metadata lives in pyproject.toml, the native build in CMakeLists.txt.

The extension snip_ops._C is built with its CUDA kernels when torch is a CUDA build and nvcc is
found, and without CUDA (the CPU implementations of quantize, dequantize and adamw_, which need only
a C++ compiler and cmake) when torch is a CPU-only build or SNIP_NO_CUDA=1 asks for it. An install
never quietly drops what it could have built: a CUDA torch without nvcc, no C++ compiler, or a torch
the build cannot see (pip's build isolation hides the installed one) stops the build with an error
that names the fix. A pure-Python install (snip_ops then runs its PyTorch reference implementations)
happens only when asked for with SNIP_NO_EXT=1. Install with `pip install --no-build-isolation .`
(or `-e .`) so that the build compiles against the torch already installed.
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
from setuptools.errors import SetupError

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


class BuildError(SetupError):
    """Why the extension cannot be built as asked; setuptools prints it as one `error:` line and pip
    shows it with the build's output."""


def build_plan():
    """True: build the extension with its CUDA kernels; False: without CUDA (the CPU implementations).
    Raises BuildError when what this environment allows is less than a plain install should give."""
    try:
        import torch
    except ImportError as e:
        raise BuildError(
            f"snip: torch is not importable where snip_ops._C is being built ({e}). pip builds in an isolated "
            "environment that hides the installed torch: install torch first, then `pip install "
            "--no-build-isolation .` (or `-e .`); for a pure-Python install without kernels, set SNIP_NO_EXT=1"
        ) from None
    if find_cxx() is None:
        raise BuildError("snip: no C++ compiler (CXX, c++, g++ or clang++) to build snip_ops._C: install one, or "
                         "set SNIP_NO_EXT=1 for a pure-Python install without kernels")
    if _truthy("SNIP_NO_CUDA"):
        print("snip: building snip_ops._C without CUDA (SNIP_NO_CUDA is set): the CPU implementations only",
              flush=True)
        return False
    if torch.version.cuda is None:
        print(f"snip: building snip_ops._C without CUDA (torch {torch.__version__} is a CPU-only build): the CPU "
              "implementations only", flush=True)
        return False
    if find_cuda_home() is None:
        raise BuildError(
            f"snip: torch {torch.__version__} is a CUDA build but nvcc was not found, so no GPU kernel could be "
            "built: set CUDA_HOME to a CUDA toolkit (12.8 or later), or set SNIP_NO_CUDA=1 to build the CPU "
            "implementations only (GPU work then runs on the slower emulated paths)")
    return True


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
        ccache = shutil.which("ccache") or Path(sys.executable).with_name("ccache")  # a venv's, unactivated
        if Path(ccache).exists():
            args.append(f"-DSNIP_CCACHE={ccache}")
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

    def run(self):
        global WITH_CUDA
        WITH_CUDA = build_plan()  # here, not at import: an sdist or metadata build needs no torch
        super().run()


WITH_CUDA = None
PURE_PYTHON = _truthy("SNIP_NO_EXT")  # no extension at all: CMakeBuild never runs
if PURE_PYTHON:
    print("snip: SNIP_NO_EXT is set: installing pure Python, without snip_ops._C (no kernels)", flush=True)
    if "editable_wheel" in sys.argv or "develop" in sys.argv:
        # An editable install would otherwise keep importing a stale module from an earlier build.
        for stale in (ROOT / "snip_ops").glob("_C*.so"):
            stale.unlink()

setup(
    ext_modules=[] if PURE_PYTHON else [CMakeExtension("snip_ops._C")],
    cmdclass={"build_ext": CMakeBuild},
)
