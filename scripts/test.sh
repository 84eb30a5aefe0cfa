#!/usr/bin/env bash
# The project's test command: install (scripts/install.sh --test: builds and SASS-checks the CUDA
# extension where nvcc exists), then run the test suite; no tests collected counts as a failure.
# The tests run in pytest-xdist workers (scripts/pytest_parallel.sh; `-n 0` runs them in one
# process): most are small and spend their time in Python, so one process would leave the other
# cores idle.
# Usage: scripts/test.sh [--no-install] [pytest arguments, e.g. -m gpu on a GPU machine]
#   --no-install: test what is installed (CI installs in a stage of its own)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --no-install ]; then
  shift
else
  bash scripts/install.sh --test
fi
rc=0
bash scripts/pytest_parallel.sh "${PYTHON:-python}" -q -p no:cacheprovider tests "$@" || rc=$?
if [ $rc = 5 ]; then echo "test.sh: pytest collected no tests" >&2; exit 1; fi
exit $rc
