#!/usr/bin/env bash
# Proves from the built binary (not from build logs) that every kernel listed in the extension's
# build_info was compiled to SASS for each arch it claims, and that those archs are the ones
# requested (SNIP_CUDA_ARCHS, default "90a;100a"). Convention (csrc/README.md): the mangled name of
# every __global__ function of op X contains X.
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
  if ! grep -q "\.${arch}\.cubin" <<<"$elves"; then
    echo "check_sass: FAIL no ${arch} cubin in $so" >&2; fail=1; continue
  fi
  functions=$("$cuobjdump" -sass -arch "$arch" "$so" | grep "Function :" || true)
  ops=$(echo "$info" | $PY -c "import json, sys; print('\n'.join(k for k, a in json.load(sys.stdin)['kernels'].items() if '$arch' in a))")
  for op in $ops; do
    n=$(grep -c -- "$op" <<<"$functions" || true)
    if [ "$n" -gt 0 ]; then
      echo "check_sass: ok   $arch $op: $n kernel(s) in SASS"
    else
      echo "check_sass: FAIL $arch $op: no kernel in SASS" >&2; fail=1
    fi
  done
done
exit $fail
