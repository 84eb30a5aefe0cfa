#!/usr/bin/env bash
# The elementwise kernels' own source (quantizers, dequantize, AdamW) through the host shim, built with
# AddressSanitizer (tests/cuda_host.py, SNIP_HOST_SHIM_ASAN=1): every host-shim kernel test again, now
# stopped by any read or write outside a buffer. No GPU tool runs in CI; this is the memory check that
# does; tests/ops/test_host_shim_asan.py first shows that it stops a kernel writing out of bounds. The
# shim's other self-tests are left out: they throw from inside the emulated threads' contexts, which the
# sanitizer's exception interceptor does not follow.
# Usage: scripts/asan_kernels.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
runtime=$(${CXX:-g++} -print-file-name=libasan.so)
if [ ! -e "$runtime" ]; then
  echo "asan_kernels: no AddressSanitizer runtime (libasan.so) for ${CXX:-g++}" >&2
  exit 1
fi
export SNIP_HOST_SHIM_ASAN=1 LD_PRELOAD="$runtime" ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:abort_on_error=1"
# -s: a sanitizer report goes to stderr as the process stops; captured output would be lost with it.
exec bash scripts/pytest_parallel.sh "$PY" -q -s -p no:cacheprovider tests/ops/test_host_shim_asan.py \
  tests/ops/test_quant_kernels_host.py tests/ops/test_adamw_kernel_host.py "$@"
