#!/usr/bin/env bash
# The performance evidence of a GPU in one prepared run that ends within a deadline (default 450 s), so
# that it fits a short lease of a GPU machine with room for a second try:
#   0. the extension: a build carried with the tree (snip_ops/_C.cpython-3*.so built against this
#      machine's Python and torch) is used when it has kernels for this GPU; otherwise it is built here
#      for this GPU's arch alone (SNIP_CUDA_ARCHS), under its own timeout;
#   1. bench_linear: SnipLinear fp8 / fp4 / mixed against nn.Linear BF16 and torchao Float8Linear, then
#      bench_host: the host time of one SnipLinear forward + backward, on a layer too small for the GPU to lag;
#   2. bench_gemm --quick --configs: the GEMMs, with every compiled Hopper tile configuration;
#   3. snip cost: the 1b preset's GEMMs with their quantization, FP8 configs tuned (the planner's table);
#   4. bench_quant (its three shapes) and 5. bench_optim gpu: the quantizer and the BF16+SR AdamW;
#   6. bench_step: a training step of the 1b preset, eager and compiled (it takes what time is left,
#      and rewrites its result after every run, so a cut leaves what it measured);
#   7. the tile quantizer's GPU tests, bit for bit against the CPU reference (their output in the log).
# Each step runs under a timeout: its own cap, or the time left before the deadline; a step that
# fails or is cut does not stop the next. Results go to DIR/bench/results/<device>-{linear,gemm,cost,
# host,quant,optim,step}.json, with <device>-perf-summary.json (device, commit, date, build, each step's command,
# exit status and seconds, and every step's output under "log"): eight files, as many as a GPU machine's output
# folder hands back. Until the summary is written the output goes to <device>-perf-log.txt, so that a run
# cut short keeps it.
# Wheels the machine lacks (nvidia-cutlass for a build, torchao for its baselines: torchao==0.17.0
# pairs with torch 2.11) travel in .whl/ at the repository root and are installed into a temporary
# directory first; without torchao its baselines are recorded as "not importable".
#
# Usage: scripts/gpu_perf.sh [--dry-run] [DIR]
#   DIR      where bench/results/ is written (default: $OUT when set, else the repository root)
#   --dry-run  on any machine, the CPU: every step in its smoke setting (seconds each), no build, no
#              wheel installed: proves the commands and their flags before GPU minutes are spent.
# Env: PYTHON (default python3), GPU_PERF_BUDGET_S (the deadline, seconds), SNIP_COMMIT (the commit,
#      where the tree travels without its git directory).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
PY=${PYTHON:-python3}
dry_run=0
if [ "${1:-}" = "--dry-run" ]; then dry_run=1; shift; fi
case "${1:-}" in -*) echo "gpu_perf: unknown option $1 (usage: gpu_perf.sh [--dry-run] [DIR])" >&2; exit 2 ;; esac
dir=${1:-${OUT:-$root}}
budget=${GPU_PERF_BUDGET_S:-450}
start=$SECONDS
results=$dir/bench/results
mkdir -p "$results"
steps_tsv=$(mktemp)
trap 'rm -f "$steps_tsv"' EXIT

if [ $dry_run = 1 ]; then
  device="cpu (smoke run)"  # the device name the benchmarks' smoke runs record (bench/gpu_bench.py)
  smoke=(--smoke)
else
  device=$("$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())") \
    || { echo "gpu_perf: no CUDA device (--dry-run runs the steps on the CPU)" >&2; exit 1; }
  smoke=()
fi
slug=$(echo "$device" | tr 'A-Z' 'a-z' | sed -e 's/[^a-z0-9]\{1,\}/-/g' -e 's/^-//' -e 's/-$//')
log=$results/$slug-perf-log.txt
commit=${SNIP_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
echo "# gpu_perf on $device, commit $commit, $(date -u '+%Y-%m-%d %H:%M UTC'), budget ${budget}s" | tee "$log"
# The host-bound timings (small layers, bench_host, eager steps) read what else the CPU is doing: say so.
load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)
if awk -v l="${load%% *}" -v n="$(nproc)" 'BEGIN { exit !(l + 0 > n / 2) }'; then
  echo "gpu_perf: warning: load average $load on $(nproc) cores before the benchmarks; host-bound timings will read it" \
    | tee -a "$log"
fi

# run_step NAME CAP OUTFILE CMD...: CMD under timeout min(CAP, time left - 5 s); a line per step in the TSV
run_step() {
  local name=$1 cap=$2 outfile=$3 left t0 rc limit
  shift 3
  left=$(( budget - (SECONDS - start) - 5 ))
  limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 20 ]; then
    echo "gpu_perf: $name skipped: ${left}s left of the budget" | tee -a "$log"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" skipped 0 "$limit" "$outfile" "$*" >>"$steps_tsv"
    return 0
  fi
  echo "gpu_perf: $name (timeout ${limit}s): $*" | tee -a "$log"
  t0=$SECONDS
  PYTHONUNBUFFERED=1 timeout -k 10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  [ $rc = 124 ] || [ $rc = 137 ] && echo "gpu_perf: $name cut at its timeout" | tee -a "$log"
  echo "gpu_perf: $name exit status $rc, $(( SECONDS - t0 ))s" | tee -a "$log"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( SECONDS - t0 ))" "$limit" "$outfile" "$*" >>"$steps_tsv"
}

# Wheels: installed into a temporary site directory, first on the path.
if compgen -G ".whl/*.whl" >/dev/null; then
  if [ $dry_run = 1 ]; then
    echo "gpu_perf: would install $(ls .whl/*.whl | wc -l) wheel(s) from .whl/" | tee -a "$log"
  else
    site=$(mktemp -d)
    run_step wheels 120 "" "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$site" .whl/*.whl
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
  fi
fi

# The extension: kernels for this device (the CPU's implementations in a dry run), else a build.
has_kernels() {
  "$PY" -c "
import sys, torch
from snip_ops import _ext
dev = 'cpu' if $dry_run else 'cuda'
sys.exit(0 if _ext.kernel_compiled('quantize', dev) else 1)" >>"$log" 2>&1
}
if [ $dry_run = 1 ]; then
  arch=90a
else
  arch=$("$PY" -c "import torch; print({(9, 0): '90a', (10, 0): '100a'}.get(torch.cuda.get_device_capability(), ''))")
fi
build=(env "SNIP_CUDA_ARCHS=$arch" "MAX_JOBS=$(nproc)" "CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}"
       "$PY" -m pip install --no-build-isolation --no-deps --no-index -e .)
if has_kernels; then
  echo "gpu_perf: the extension has kernels for $device: no build" | tee -a "$log"
elif [ $dry_run = 1 ]; then
  echo "gpu_perf: the extension does not load here: the smoke runs emulate; a GPU run would build: ${build[*]}" | tee -a "$log"
elif [ -z "$arch" ]; then
  echo "gpu_perf: snip has no kernels for this GPU's arch: no build, the benchmarks time what runs" | tee -a "$log"
else
  run_step build 300 "" "${build[@]}"
fi
"$PY" -c "import json, snip_ops; print('build_info', json.dumps(snip_ops.build_info()))" >>"$log" 2>&1

out() { echo "$results/$slug-$1.json"; }
# --tune: the FP8 GEMM configs of each shape are timed first and the fastest kept (one disk cache for
# every step), so the layer and step timings run the configs this GPU chose, the new ones included.
run_step linear 150 "$(out linear)" "$PY" -m bench.bench_linear --tune --profile "${smoke[@]}" --out "$(out linear)"
run_step host 45 "$(out host)" "$PY" -m bench.bench_host "${smoke[@]}" --out "$(out host)"
# The GPU run's flags stay in the dry run (its smoke setting overrides the shapes), so they are checked too.
run_step gemm 120 "$(out gemm)" "$PY" -m bench.bench_gemm --quick --configs "${smoke[@]}" --out "$(out gemm)"
if [ $dry_run = 1 ]; then cost_shape=(--preset tiny --tokens 256 --device cpu); else cost_shape=(--preset 1b --tokens 8192); fi
run_step cost 90 "$(out cost)" "$PY" -m snip_train cost "${cost_shape[@]}" --out "$(out cost)"
run_step quant 90 "$(out quant)" "$PY" -m bench.bench_quant "${smoke[@]}" --out "$(out quant)"
run_step optim 90 "$(out optim)" "$PY" -m bench.bench_optim gpu "${smoke[@]}" --out "$(out optim)"
run_step step 600 "$(out step)" "$PY" -m bench.bench_step --tune "${smoke[@]}" --out "$(out step)"
# Last, so that its load on the CPU (the oracle runs there) touches no timing: the tile quantizer's GPU tests
# against the CPU reference, bit for bit (the shapes that take CTAs over several tiles among them).
run_step quant-tests 90 "" bash scripts/pytest_parallel.sh "$PY" -m gpu -q -p no:cacheprovider \
  tests/ops/test_quant_kernels_gpu.py -k "large or fused or bigger or 2d_blocks or sr_transposed"

summary=$results/$slug-perf-summary.json
"$PY" - "$steps_tsv" "$summary" "$device" "$commit" "$budget" "$dry_run" "$(( SECONDS - start ))" "$load" "$log" <<'PY'
import datetime, json, os, platform, sys
tsv, path, device, commit, budget, dry_run, seconds, load, log = sys.argv[1:]
steps = []
for line in open(tsv):
    name, rc, secs, limit, outfile, command = line.rstrip("\n").split("\t")
    steps.append({"step": name, "exit_status": None if rc == "skipped" else int(rc), "skipped": rc == "skipped",
                  "seconds": int(secs), "timeout_s": int(limit), "command": command,
                  "output": os.path.basename(outfile) if outfile else None,
                  "output_written": bool(outfile) and os.path.exists(outfile)})
try:
    import snip_ops
    build = snip_ops.build_info()
except Exception as e:  # the summary is written whatever broke
    build = f"{type(e).__name__}: {e}"
summary = {"device": device, "commit": commit,
           "command": f"GPU_PERF_BUDGET_S={budget} scripts/gpu_perf.sh" + (" --dry-run" if dry_run == "1" else ""),
           "dry_run": dry_run == "1",
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "python": platform.python_version(), "platform": platform.platform(), "budget_s": int(budget),
           "seconds": int(seconds), "loadavg_at_start": load, "build": build, "steps": steps,
           "log": open(log, errors="replace").read().splitlines()}
with open(path, "w") as f:
    json.dump(summary, f, indent=1)
    f.write("\n")
os.remove(log)  # now in the summary
for s in steps:
    status = "skipped" if s["skipped"] else f"exit {s['exit_status']}"
    print(f"{s['step']:>8} {status:>8} {s['seconds']:4d}s  {s['output'] or ''}")
PY
failed=$(awk -F'\t' '$2 != "0" {print $1}' "$steps_tsv" | tr '\n' ' ')
echo "gpu_perf: ${failed:+failed or skipped: $failed; }results in $results/$slug-* ($(( SECONDS - start ))s)"
[ -z "$failed" ]
