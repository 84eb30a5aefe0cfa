#!/usr/bin/env bash
# Proves from the built binary (not from build logs) that every kernel listed in the extension's
# build_info was compiled to SASS for each arch it claims, and that those archs are the ones
# requested (SNIP_CUDA_ARCHS, default "90a;100a"). Convention (csrc/README.md): the mangled name of
# every __global__ function of op X contains X. GEMM kernels (names with "gemm"; their entry is
# <name>_kernel) must also run on tensor cores: every one of their functions holds an FP8/FP4
# tensor-core MMA -- QGMMA (wgmma with FP8 operands) on sm_90a, UTC*MMA (tcgen05) on sm_100a.
# Memory-bound kernels whose speed rests on how many CTAs fit on an SM also get a register ceiling
# and no spills (no stack frame, no local memory), from the binary's resource usage (AdamW: 3 CTAs of
# 256 threads, so that enough loads are in flight, csrc/optim/adamw.cu; the tile quantizer's 16-bit
# instantiations of the layer's kinds -- row + column 128, square blocks, Hadamard -- two CTAs of 512
# threads, csrc/quant/quantize_tile.cu). A limit's kernel is a regular expression on the mangled name.
# Usage: scripts/check_sass.sh [path/to/_C.so]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}

so=${1:-$($PY -c "import snip_ops._C as m; print(m.__file__)")}
info=$($PY -c "import json, torch, snip_ops._ext as e; assert e.HAS_KERNELS, e.build_info(); print(json.dumps(e.build_info()))")

cuobjdump=""
for c in "${CUDA_HOME:+$CUDA_HOME/bin/cuobjdump}" "$(command -v cuobjdump || true)" \
         "$($PY -c 'import os, triton; print(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump"))' 2>/dev/null || true)"; do
  if [ -n "$c" ] && [ -x "$c" ]; then cuobjdump=$c; break; fi
done
[ -n "$cuobjdump" ] || { echo "check_sass: no cuobjdump (CUDA toolkit or triton)" >&2; exit 1; }

echo "check_sass: $so"
elves=$("$cuobjdump" -lelf "$so")
echo "$elves"

want=$(echo "${SNIP_CUDA_ARCHS:-90a;100a}" | tr ',; ' '\n\n\n' | sed -e '/^$/d' -e 's/^sm_//' -e 's/^/sm_/' | sort -u)
have=$(echo "$info" | $PY -c "import json, sys; print('\n'.join(sorted(json.load(sys.stdin)['compiled_archs'])))")
[ "$want" = "$have" ] || { echo "check_sass: build_info archs [$have] != requested [$want]" >&2; exit 1; }

fail=0
for arch in $want; do
  # cuobjdump before 13 names an sm_90a cubin "sm_90" (the arch-specific "a" is then proven by
  # the wgmma/tcgen05 instructions below, which only the "a" targets have).
  if ! grep -qE "\.${arch%a}a?\.cubin" <<<"$elves"; then
    echo "check_sass: FAIL no ${arch} cubin in $so" >&2; fail=1; continue
  fi
  sass=$("$cuobjdump" -sass -arch "$arch" "$so")
  functions=$(grep "Function :" <<<"$sass" || true)
  ops=$(echo "$info" | $PY -c "import json, sys; print('\n'.join(k for k, a in json.load(sys.stdin)['kernels'].items() if '$arch' in a))")
  for op in $ops; do
    n=$(grep -c -- "$op" <<<"$functions" || true)
    if [ "$n" -gt 0 ]; then
      echo "check_sass: ok   $arch $op: $n kernel(s) in SASS"
    else
      echo "check_sass: FAIL $arch $op: no kernel in SASS" >&2; fail=1
    fi
    case $op in *gemm*) ;; *) continue ;; esac
    mma='\bQGMMA\.[0-9x]+\.F32\.E[45]M[23]\.E[45]M[23]\b'
    [ "$arch" = sm_100a ] && mma='\bUTC\w*MMA\b'
    # Per function of this GEMM's entry (<op>_kernel): its tensor-core MMA instructions.
    report=$($PY -c "
import re, sys
text, op, mma = sys.stdin.read(), sys.argv[1], re.compile(sys.argv[2])
for chunk in text.split('Function : ')[1:]:
    name, _, body = chunk.partition('\n')
    if op + '_kernel' in name:
        found = sorted(set(mma.findall(body)))
        print(len(mma.findall(body)), ' '.join(found) or '-')
" "$op" "$mma" <<<"$sass")
    if [ -z "$report" ]; then
      echo "check_sass: FAIL $arch $op: no ${op}_kernel function" >&2; fail=1
    elif grep -q -- " -$" <<<"$report"; then
      echo "check_sass: FAIL $arch $op: a kernel without tensor-core MMA ($mma)" >&2; fail=1
    else
      while read -r count instrs; do
        echo "check_sass: ok   $arch ${op}_kernel: $count x $instrs"
      done <<<"$report"
    fi
  done
  usage=$("$cuobjdump" --dump-resource-usage -arch "$arch" "$so")
  for limit in "adamw_kernel 80" "quantize_tile_kernelI(13__nv_bfloat16|6__half)\w*TileKindE[123]E 64"; do
    read -r kernel max_reg <<<"$limit"
    report=$($PY -c "
import re, sys
kernel, max_reg = sys.argv[1], int(sys.argv[2])
names = re.findall(r'Function (\S+):\n\s*REG:(\d+) STACK:(\d+) .*?LOCAL:(\d+)', sys.stdin.read())
rows = sorted({(int(r), int(st) + int(l)) for n, r, st, l in names if re.search(kernel, n)})
print('none' if not rows else ' '.join(f'{r}/{b}' for r, b in rows))
sys.exit(0 if rows and all(r <= max_reg and b == 0 for r, b in rows) else 1)
" "$kernel" "$max_reg" <<<"$usage") && ok=1 || ok=0
    if [ "$ok" = 1 ]; then
      echo "check_sass: ok   $arch $kernel: registers/spilled bytes $report (<= $max_reg, no spills)"
    else
      echo "check_sass: FAIL $arch $kernel: registers/spilled bytes $report (want <= $max_reg, no spills)" >&2; fail=1
    fi
  done
done
exit $fail
