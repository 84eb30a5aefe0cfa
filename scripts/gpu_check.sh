#!/usr/bin/env bash
# Everything that needs a GPU, in one go, writing its evidence to bench/results/, quickest and most
# telling first (a lease that ends early still leaves the earlier steps' evidence):
#   1. snip doctor: every compiled kernel against the reference, timed, and which model of the FP8
#      tensor core's accumulation the Hopper GEMM follows (bench/results/<device>-doctor.json);
#   2. the GPU tests (pytest -m gpu) of the GEMMs, the linear layer, the optimizer and the training
#      step: kernels against their PyTorch references;
#   3. the kernel microbenchmarks: quantization, GEMMs, the BF16+SR optimizer;
#   4. the quantization kernels' GPU tests (about 2,700 cases, bit for bit against the CPU oracle:
#      the longest step, CPU-bound, spread over up to 8 processes when pytest-xdist is installed).
# The test log (bench/results/<device>-gpu-tests.txt) has a line per test as it ends, so a run cut
# short still names every failure so far.
# Run after the extension is built for this GPU (scripts/install.sh, or
# pip install --no-build-isolation --no-deps -e . on an offline machine). Exits non-zero if a test
# fails; the benchmarks still run, so that one broken kernel does not hide the others' numbers.
# Usage: scripts/gpu_check.sh [--quick]   (--quick: fewer shapes in the GEMM/quant benchmarks)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
quick=()
[ "${1:-}" = "--quick" ] && quick=(--quick)

device=$("$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())") \
  || { echo "gpu_check: no CUDA device" >&2; exit 1; }
slug=$(echo "$device" | tr 'A-Z' 'a-z' | sed -e 's/[^a-z0-9]\{1,\}/-/g' -e 's/^-//' -e 's/-$//')
mkdir -p bench/results
log=bench/results/$slug-gpu-tests.txt
{
  echo "# pytest -m gpu on $device"
  echo "# commit $(git rev-parse HEAD 2>/dev/null), $(date -u '+%Y-%m-%d %H:%M UTC')"
  "$PY" -c "import snip_ops, json; print(json.dumps(snip_ops.build_info()))"
} > "$log"
"$PY" -m snip_train doctor --results bench/results 2>&1 | tee -a "$log"
doctor_rc=${PIPESTATUS[0]}
gpu_tests() {  # pytest -m gpu on the given paths: a line per test into the log, failures on the terminal
  local part=$log.part rc
  # The oracle runs on the CPU: scripts/pytest_parallel.sh spreads the tests over the cores.
  COLUMNS=240 bash scripts/pytest_parallel.sh "$PY" -m gpu -v -rfEs --tb=short -p no:cacheprovider "$@" >"$part" 2>&1
  rc=$?
  cat "$part" >>"$log"
  grep -E "^(FAILED|ERROR) tests/|^=+ .*(passed|failed|error|skipped|no tests ran)" "$part" | tail -40
  rm -f "$part"
  return $rc
}
quant_tests=tests/ops/test_quant_kernels_gpu.py
gpu_tests tests --ignore "$quant_tests"
tests_rc=$?

rc=$tests_rc
[ "$doctor_rc" = 0 ] || rc=1
for bench in "bench.bench_quant ${quick[*]}" "bench.bench_gemm ${quick[*]}" "bench.bench_optim gpu"; do
  echo "gpu_check: $bench"
  # shellcheck disable=SC2086
  "$PY" -m $bench || { echo "gpu_check: $bench failed" >&2; rc=1; }
done
gpu_tests "$quant_tests"
quant_rc=$?
[ "$quant_rc" = 0 ] || rc=1
echo "gpu_check: doctor exit status $doctor_rc, GPU tests $tests_rc, quantization GPU tests $quant_rc; results in bench/results/$slug-*"
exit $rc
