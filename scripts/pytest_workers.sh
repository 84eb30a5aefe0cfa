#!/usr/bin/env bash
# How many pytest-xdist worker processes to run the tests in: one per core, at most 8 (each imports
# torch); 0 where pytest-xdist is missing. Callers give each worker cores / workers intra-op threads:
# oversubscribed pools slow the suite down (bench/results/nvidia-h100-80gb-hbm3-gpu-check.json: 16
# workers with torch's default pools ran the quantization tests at 6.3 tests/s on a 16-core machine;
# bench/results/nvidia-h200-gpu-check.json: 8 workers of 2 threads, 127 tests/s).
# Usage: pytest_workers.sh PYTHON
set -euo pipefail
if ! "${1:-python}" -c "import xdist" 2>/dev/null; then echo 0; exit 0; fi
cores=$(nproc 2>/dev/null || echo 1)
echo $(( cores < 8 ? cores : 8 ))
