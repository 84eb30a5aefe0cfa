#!/usr/bin/env bash
# Runs one CI stage: COMMAND, timed against BUDGET seconds. Fails naming the stage when the command
# fails (with its exit status) or takes longer than its budget (exit status 1); the budgets and how
# they were set: bench/results/cpu-build-and-test.md.
# Usage: scripts/stage.sh NAME BUDGET_SECONDS COMMAND...
set -uo pipefail
name=$1 budget=$2
shift 2
echo "CI: stage $name (budget ${budget}s): $*"
start=$SECONDS
"$@"
rc=$?
took=$(( SECONDS - start ))
if [ $rc != 0 ]; then
  echo "CI: FAILED stage $name (exit status $rc, ${took}s)" >&2
  exit $rc
fi
if [ $took -gt "$budget" ]; then
  echo "CI: FAILED stage $name took ${took}s, over its budget of ${budget}s" >&2
  exit 1
fi
echo "CI: stage $name passed in ${took}s (budget ${budget}s)"
