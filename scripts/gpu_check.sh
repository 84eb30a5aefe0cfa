#!/usr/bin/env bash
# Everything that needs a GPU, in one go, writing its evidence to bench/results/:
#   1. snip doctor: every compiled kernel against the reference, timed (bench/results/<device>-doctor.json);
#   2. the GPU tests (pytest -m gpu): kernels against their PyTorch references, bit for bit;
#   3. the kernel microbenchmarks: quantization, GEMMs, the BF16+SR optimizer.
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
"$PY" -m pytest -m gpu -q -rs tests 2>&1 | tee -a "$log"
tests_rc=${PIPESTATUS[0]}

rc=$tests_rc
[ "$doctor_rc" = 0 ] || rc=1
for bench in "bench/bench_quant.py ${quick[*]}" "bench/bench_gemm.py ${quick[*]}" "bench/bench_optim.py gpu"; do
  echo "gpu_check: $bench"
  # shellcheck disable=SC2086
  "$PY" $bench || { echo "gpu_check: $bench failed" >&2; rc=1; }
done
echo "gpu_check: doctor exit status $doctor_rc, tests $tests_rc; results in bench/results/$slug-*"
exit $rc
