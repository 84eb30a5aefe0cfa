#!/usr/bin/env bash
# The main job, from a fresh clone: install snip, then train the tiny Llama-like model with the
# SNIP planner (at least 75% of the linear-layer FLOPs in FP4, the rest FP8, re-planned every 50
# steps) next to a bf16 run and a layer-type baseline on the same data. Runs on the CPU when there
# is no GPU. The CUDA extension is built where nvcc, a CUDA torch and a GPU exist; without a GPU its
# kernels could not run, so a fresh machine skips the 5-minute CUDA build and builds only the CPU
# implementations of the quantizer and optimizer (seconds; bit-identical to the PyTorch reference,
# about 2x faster training steps); an extension that is already built, e.g. by scripts/test.sh, is kept.
# Output: runs/main/ (plan table on stdout; snip/plan.json, snip/plan.png, loss_comparison.png,
# per-run summary.json and loss.png). Extra arguments go to `snip train`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
if ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; } \
   && ! "$PY" -c "import snip_ops._C" 2>/dev/null; then
  export SNIP_NO_CUDA=${SNIP_NO_CUDA:-1}
fi
bash scripts/install.sh
exec "$PY" -m snip_train train --preset tiny --steps 100 --batch-size 8 --threads 1 --planner --fp4-fraction 0.75 --planner-interval 50 \
  --eval-interval 25 --out runs/main "$@"
