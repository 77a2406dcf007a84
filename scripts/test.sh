#!/usr/bin/env bash
# Builds pinmem with its tests and runs them all.
# Optional argument: sanitizers to build with ("address,undefined" or "thread").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/ensure-tools.sh
sanitize=${1:-}
dir=build-test${sanitize:+-${sanitize//,/-}}
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=ON \
    -DPINMEM_SANITIZE="$sanitize" >/dev/null
cmake --build "$dir" -j"$(nproc)" >/dev/null
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
(cd "$dir" && ctest --output-on-failure -j2)
# The Python suites, against this build's library: not the TSan one, whose
# shadow memory holds the stray addresses the suites pass on purpose.
[[ $sanitize == *thread* ]] || bash scripts/test-python.sh "$dir"
