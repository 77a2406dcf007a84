#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF >/dev/null 2>&1 && cmake --build build-gpu -j16 >/dev/null 2>&1 || { echo build failed; exit 1; }
for pass in 1 2 3; do
for v in "a" "p4 XAHEAD=4" "p3 XAHEAD=3" "p6 XAHEAD=6"; do
  set -- $v; name=$1; shift
  echo "== pass $pass variant $name: $*"
  env "$@" ./build-gpu/tools/pinmem bench staging 2>&1 | grep -E "^([0-9]+ [KMG]iB .*(htod|dtoh))"
done
done 2>&1 | tee "$OUT/exp.txt"
