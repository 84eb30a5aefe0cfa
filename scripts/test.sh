#!/usr/bin/env bash
# The project's test command: install (scripts/install.sh: builds and SASS-checks the CUDA
# extension where nvcc exists), then run the test suite; no tests collected counts as a failure.
# The tests run in pytest-xdist workers (scripts/pytest_parallel.sh; `-n 0` runs them in one
# process): most are small and spend their time in Python, so one process would leave the other
# cores idle. Extra arguments go to pytest (e.g. -m gpu on a GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
rc=0
bash scripts/pytest_parallel.sh "${PYTHON:-python}" -q tests "$@" || rc=$?
if [ $rc = 5 ]; then echo "test.sh: pytest collected no tests" >&2; exit 1; fi
exit $rc
