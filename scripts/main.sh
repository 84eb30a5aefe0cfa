#!/usr/bin/env bash
# The main job, from a fresh clone: install snip (building the CUDA extension where nvcc and a CUDA
# torch exist), then train the tiny Llama-like model with the SNIP planner (at least 75% of the
# linear-layer FLOPs in FP4, the rest FP8, re-planned every 50 steps) next to a bf16 run and a
# layer-type baseline on the same data. Runs on the CPU when there is no GPU.
# Output: runs/main/ (plan table on stdout; snip/plan.json, snip/plan.png, loss_comparison.png,
# per-run summary.json and loss.png). Extra arguments go to `snip train`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
bash scripts/install.sh
exec "$PY" -m snip_train train --preset tiny --steps 100 --batch-size 8 --threads 1 --planner --fp4-fraction 0.75 --planner-interval 50 \
  --eval-interval 25 --out runs/main "$@"
