#!/usr/bin/env bash
# Runs pytest with the given arguments in pytest-xdist workers, one per core and at most 8 (each
# imports torch), each with cores / workers intra-op threads unless OMP_NUM_THREADS is set:
# oversubscribed pools slow the suite down (bench/results/nvidia-h100-80gb-hbm3-gpu-check.json: 16
# workers with torch's default pools ran the quantization tests at 6.3 tests/s on a 16-core machine;
# bench/results/nvidia-h200-gpu-check.json: 8 workers of 2 threads, 127 tests/s). worksteal: the
# minutes-long exhaustive tests must not leave one worker holding a queue. Without pytest-xdist, or
# with `-n 0` among the arguments, the tests run in one process.
# Usage: pytest_parallel.sh PYTHON [pytest arguments]
set -euo pipefail
py=$1
shift
if ! "$py" -c "import xdist" 2>/dev/null; then exec "$py" -m pytest "$@"; fi
cores=$(nproc 2>/dev/null || echo 1)
workers=$(( cores < 8 ? cores : 8 ))
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( cores / workers ))}
# Idle OpenMP threads sleep instead of spinning: the workers (and the processes tests start) share
# the cores, and a spinning pool takes them from the others (bench/results/cpu-build-and-test.md);
# it changes no result.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
exec "$py" -m pytest -n "$workers" --dist worksteal "$@"
