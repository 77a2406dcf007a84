#!/usr/bin/env bash
# Builds pinmem, then shows what it sees on this machine and a short benchmark:
# cold pinning against the backend's own way, registry lookups, and copies
# from 4 KiB to 1 GiB beside the driver's, drawn into build/copy.png where
# gnuplot is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-tools.sh --plot
mkdir -p build
echo "building pinmem in build/ (log: build/build.log)"
if ! { cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF &&
    cmake --build build -j"$(nproc)"; } >build/build.log 2>&1; then
    tail -n 30 build/build.log
    echo "the build failed; build/build.log has the whole log" >&2
    exit 1
fi
echo
./build/tools/pinmem info
echo
./build/tools/pinmem bench --quick
echo
plot=()
! command -v gnuplot >/dev/null || plot=(--plot build/copy.png)
./build/tools/pinmem bench copy --quick "${plot[@]}"
