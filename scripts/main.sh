#!/usr/bin/env bash
# The main job, from a fresh clone: install snip, then the paired comparison of the tiny Llama-like model:
# 200 shared bf16 warm-up steps, then from that one state 60 more steps per branch: bf16, SNIP (at least
# 75% of the linear-layer FLOPs in FP4, the rest FP8, re-planned every 30 steps) and the baselines at the
# same budget, interval and statistics (first_last, layer_type, min_rel_error, min_abs_error, random;
# uniform_fp4 at 100% FP4), for branch seeds 0, 1 and 2; every method of a seed sees the same batches.
# It prints each method's final validation-loss gap to the bf16 branch of its seed (mean, spread, seeds
# won), which is why its ranking does not depend on the machine. Branches run in min(2, CPUs) processes
# of one torch thread. Runs on the CPU when there is no GPU. The CUDA extension is built where nvcc, a
# CUDA torch and a GPU exist; without a GPU its kernels could not run, so a fresh machine skips the
# 5-minute CUDA build and builds only the CPU implementations of the quantizer and optimizer (seconds;
# bit-identical to the PyTorch reference, about 2x faster training steps), as it does where such a
# CPU-only extension is already installed; an extension with CUDA kernels, e.g. built by scripts/test.sh,
# is kept.
# Output: runs/main/ (plan table and comparison table on stdout; snip/plan.json, snip/plan.png,
# branch_gaps.png, comparison.json, warmup/). Extra arguments go to `snip train` and override these.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; } \
   && ! "$PY" -c "import sys; from snip_ops import _ext; sys.exit(not _ext.compiled_archs())" 2>/dev/null; then
  export SNIP_NO_CUDA=${SNIP_NO_CUDA:-1}
fi
bash scripts/install.sh
exec "$PY" -m snip_train train --preset tiny --steps 260 --branch-at 200 --batch-size 8 --threads 1 --planner --fp4-fraction 0.75 --planner-interval 30 --branch-seeds 0,1,2 --eval-interval 20 --out runs/main "$@"
