#!/usr/bin/env bash
# The project's test command: install (scripts/install.sh: builds and SASS-checks the CUDA
# extension where nvcc exists), then run the test suite; no tests collected counts as a failure.
# The tests run in pytest-xdist workers (scripts/pytest_workers.sh; `-n 0` runs them in this
# process): most are small and spend their time in Python, so one process would leave the other
# cores idle. OMP_NUM_THREADS, where set, is each worker's intra-op thread count.
# Extra arguments go to pytest (e.g. -m gpu on a GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
PY=${PYTHON:-python}
workers=$(bash scripts/pytest_workers.sh "$PY")
args=()
if [ "$workers" -gt 0 ]; then
  # worksteal: the minutes-long exhaustive tests must not leave one worker holding a queue.
  args=(-n "$workers" --dist worksteal)
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / workers ))}
fi
rc=0
"$PY" -m pytest -q "${args[@]}" tests "$@" || rc=$?
if [ $rc = 5 ]; then echo "test.sh: pytest collected no tests" >&2; exit 1; fi
exit $rc
