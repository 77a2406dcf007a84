#!/usr/bin/env bash
# One call on the GPU machine: build (with the probes), run the whole suite on
# the CUDA backend (the differential test included) and on the POSIX backend,
# then the benchmarks. Everything it writes lands in $OUT, never in the tree
# (default: a new directory under ${TMPDIR:-/tmp}, printed at the start).
# At most 8 files come back from the GPU machine: keep to env.txt, tests.log,
# differential.log, bench.txt, copy.png, bench-pool-vmm.txt, python.txt and
# one more.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/pinmem-gpu.XXXXXX")}
mkdir -p "$OUT"
echo "results: $OUT"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=ON -DPINMEM_BUILD_PROBES=ON \
    >"$OUT/build.log" 2>&1 &&
    cmake --build build-gpu -j"$(nproc)" >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
rm -f "$OUT/build.log" # only a failed build's log comes back: few files do
{
    date -u +"date: %Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    uname -r | sed 's/^/kernel: /'
    nproc | sed 's/^/cpus: /'
    grep MemTotal /proc/meminfo
    lscpu 2>/dev/null | grep -E "^Model name|^Thread\(s\) per core|^Core\(s\) per socket|^Socket|^CPU max MHz|^Hypervisor"
    # Which CPUs share a core, as the guest sees it (one group per core).
    echo "core groups: $(cat /sys/devices/system/cpu/cpu*/topology/core_cpus_list 2>/dev/null | sort -un | tr '\n' ' ')"
    # How far the CPUs scale on code that shares nothing: the ceiling for the
    # pools' thread-scaling figures.
    ./build-gpu/bench/probe/probe_cpu_scaling
} >"$OUT/env.txt"
cat "$OUT/env.txt"

./build-gpu/tools/pinmem info | tee -a "$OUT/env.txt"

echo "== tests, CUDA backend"
(cd build-gpu && ctest --output-on-failure -j4) 2>&1 | tee "$OUT/tests.log" | tail -25
echo "== differential test, verbose"
./build-gpu/tests/test_differential 2>&1 | tee "$OUT/differential.log"
echo "== tests, POSIX backend on the same machine"
# From the summary on: tests skipped on POSIX are listed after it.
(cd build-gpu && PINMEM_BACKEND=posix ctest -j4 -E differential) 2>&1 | tee -a "$OUT/tests.log" |
    sed -n '/tests passed/,$p'
echo "== benchmarks"
# PINMEM_BENCH selects (default: pool, copy and staging); "all" adds cold
# allocation and the registry.
for what in ${PINMEM_BENCH:-pool copy staging}; do
    plot=()
    [ "$what" != copy ] && [ "$what" != all ] || plot=(--plot "$OUT/copy.png")
    ./build-gpu/tools/pinmem bench "$what" "${plot[@]}" 2>&1 | tee -a "$OUT/bench.txt"
done

# Pools with a release threshold pin VMM host granules; PINMEM_POOL_VMM=1
# makes pools that keep their memory do so too: the pool tests that way, and
# the steady-state footprint of such pools.
echo "== every pool in VMM host granules (PINMEM_POOL_VMM=1): tests and footprint"
{
    for t in pool pool_granules pool_model pool_streams copy events; do
        PINMEM_POOL_VMM=1 ./build-gpu/tests/test_$t 2>&1 | grep -E "backend:|checks passed|check\(s\) failed|skipped|CHECK failed"
    done
    PINMEM_POOL_VMM=1 ./build-gpu/tools/pinmem bench footprint 2>&1
} | tee "$OUT/bench-pool-vmm.txt"

# The pools on the POSIX backend of the same machine, against glibc malloc.
echo "== pool benchmark, POSIX backend"
PINMEM_BACKEND=posix ./build-gpu/tools/pinmem bench pool --quick 2>&1 | tee -a "$OUT/bench.txt"

# PINMEM_SWEEP="workers:chunk[:buffers[:slice[:htod_workers]]] ..." measures staged copies
# with other staging shapes (pinmem bench staging), all into sweep.txt.
if [ -n "${PINMEM_SWEEP:-}" ]; then
for shape in $PINMEM_SWEEP; do
    IFS=: read -r workers chunk buffers slice htod <<<"$shape"
    echo "== staging, $workers workers, $chunk pieces, ${buffers:-default} buffers, ${slice:-default} slices, ${htod:-default} of the workers for host to device"
    PINMEM_COPY_WORKERS=$workers PINMEM_COPY_CHUNK=$chunk PINMEM_COPY_BUFFERS=${buffers:-} \
        PINMEM_COPY_SLICE=${slice:-} PINMEM_COPY_HTOD_WORKERS=${htod:-} ./build-gpu/tools/pinmem bench staging 2>&1 |
        grep -E "^(staged|[0-9]+ [MG]iB .*(htod|dtoh))"
done 2>&1 | tee "$OUT/sweep.txt"
fi

# The Python package (python/): its suites on CUDA with torch, CuPy, Numba
# and cuda.core, Numba's own pinned-memory tests with pinmem's plugin, and
# python -m pinmem bench, all into python.txt (bench/gpu-python.sh alone
# repeats it: OUT=... bash bench/gpu-python.sh build-gpu).
# PINMEM_GPU_SKIP_PYTHON=1 stops here (the Python step then runs in a call
# of its own, within the GPU machine's per-command limit).
[ -z "${PINMEM_GPU_SKIP_PYTHON:-}" ] || exit 0
echo "== Python package"
bash bench/gpu-python.sh build-gpu 2>&1 | tee "$OUT/python.txt" | grep -E "^== |passed|failed|Error" | tail -30

# The preload library and pinmem.torch.install() with unmodified PyTorch: the
# checks, the speed-ups side by side and a PASS/FAIL table, all into
# preload.txt (bench/gpu-preload.sh alone repeats it: bash bench/gpu-preload.sh build-gpu).
echo "== preload library and pinmem.torch.install()"
bash bench/gpu-preload.sh build-gpu 2>&1 | tee "$OUT/preload.txt" | sed -n '/^== summary/,$p'
