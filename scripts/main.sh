#!/usr/bin/env bash
# Builds pinmem, then shows what it sees here and a short benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-tools.sh --plot
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
./build/tools/pinmem info
echo
./build/tools/pinmem bench --quick
echo
./build/tools/pinmem bench copy --quick --plot build/copy.png
