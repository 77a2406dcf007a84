#!/usr/bin/env bash
# One call on the GPU machine for the copy engine's settings: pinmem bench
# copy with the settings in effect (every section, the plot), then each new
# setting swept on its own, one compact table a setting, so that one call
# tells which values to make the defaults. Builds pinmem into build-gpu
# where needed. Writes only to $OUT (default: a new directory under
# ${TMPDIR:-/tmp}), three files:
#   copy.txt       the environment, pinmem bench copy and bench staging --quick
#   sweep.txt      the tables, then every run's own output
#   copy-plot.tar  copy.png (where gnuplot is installed), copy.png.dat and .gp
# The sweeps stop where the whole call would pass GPU_COPY_BUDGET seconds
# (default 420), each table saying what it skipped. GPU_COPY_QUICK=1 runs
# every step with --quick (64 MiB at most, 100 blocks a batch), to try the
# script where no GPU is.
#
# Every figure is a ratio within one run: "% of pinned" is pinmem's rate from
# or into pageable memory over the driver's from or into page-locked memory
# in the same process (pinmem bench copy says how each is measured).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/pinmem-gpu-copy.XXXXXX")}
mkdir -p "$OUT"
echo "results: $OUT"
budget=${GPU_COPY_BUDGET:-420}
start=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/pinmem-gpu-copy-work.XXXXXX")
trap 'rm -rf "$work"' EXIT

if [ ! -f build-gpu/CMakeCache.txt ]; then
    cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF >"$work/build.log" 2>&1 ||
        { tail -30 "$work/build.log"; exit 1; }
fi
cmake --build build-gpu -j"$(nproc)" --target pinmem_cli >>"$work/build.log" 2>&1 ||
    { tail -30 "$work/build.log"; exit 1; }
pinmem=./build-gpu/tools/pinmem

# ---------------------------------------------------------------- main run
{
    date -u +"date: %Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    nproc | sed 's/^/cpus: /'
    lscpu 2>/dev/null | grep -E "^Model name|^Socket|^NUMA node\(s\)"
    echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo
    echo "== pinmem bench copy (the settings in effect)"
    PINMEM_BENCH_COPY="sizes cache both batch summary" "$pinmem" bench copy ${GPU_COPY_QUICK:+--quick} \
        --plot "$work/copy.png" 2>&1
    echo
    echo "== pinmem bench staging --quick"
    "$pinmem" bench staging --quick 2>&1
} | tee "$OUT/copy.txt"
(cd "$work" && tar -cf "$OUT/copy-plot.tar" copy.png* 2>/dev/null)

# ------------------------------------------------------------------- sweeps
# run LABEL SECTIONS QUICK [VAR=VALUE...]: one pinmem bench copy with the
# settings given, its output kept for the end of sweep.txt; sets $summary to
# its summary line ("" when it failed or was skipped for time).
summary=""
run() {
    local label=$1 sections=$2 quick=$3
    shift 3
    summary=""
    if [ $(($(date +%s) - start)) -ge "$budget" ]; then
        echo "== $label: skipped, the call is past ${budget}s" >>"$work/raw.txt"
        return
    fi
    local q=()
    [ "$quick" = quick ] || [ -n "${GPU_COPY_QUICK:-}" ] && q=(--quick)
    echo "== $label (${*:-the settings in effect}; sections: $sections${q[*]:+, --quick})" >>"$work/raw.txt"
    env "$@" PINMEM_BENCH_COPY="$sections summary" "$pinmem" bench copy "${q[@]}" >"$work/one.txt" 2>&1
    cat "$work/one.txt" >>"$work/raw.txt"
    summary=$(grep '^summary:' "$work/one.txt" | tail -1)
}

# The value of a summary key, or "-".
get() {
    local v
    v=$(sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$summary")
    echo "${v:--}"
}

# row LABEL KEY...: one table row from $summary.
row() {
    local label=$1
    shift
    printf '%-24s' "$label"
    for k in "$@"; do printf ' %7s' "$(get "$k")"; done
    echo
}

mid=(256K 512K 1M 2M 4M 8M 16M)
mid_keys() { # htod and dtoh % of pinned at the mid sizes
    for d in htod dtoh; do for s in "${mid[@]}"; do echo "$d.$s"; done; done
}
staged_keys() { # staged-only time over the driver's, where direct_max is chosen
    for d in htod dtoh; do for s in 256K 512K 1M 2M 4M; do echo "$d.$s.staged"; done; done
}
mid_header() {
    printf '%-24s' "$1"
    for d in to from; do for s in "${mid[@]}"; do printf ' %7s' "$d$s"; done; done
    echo
}

{
echo "Each row is one pinmem bench copy run with the setting named; \"toN\" is pageable ->"
echo "device and \"fromN\" device -> pageable at N bytes, as a % of the pinned ceiling of"
echo "the same run (higher is better), unless a table says otherwise. Started $(date -u +%H:%M:%SZ)."
echo

echo "== piece sizes: PINMEM_COPY_FIRST_PIECE x PINMEM_COPY_PIECES (mid sizes, --quick)"
mid_header "first piece, pieces"
declare -A pieces_summary
for first in 64K 128K 256K 512K; do
    for pieces in 1 4 8; do
        run "first piece $first, $pieces pieces" mid quick \
            PINMEM_COPY_FIRST_PIECE=$first PINMEM_COPY_PIECES=$pieces
        pieces_summary["$first, $pieces"]=$summary
        row "$first, $pieces" $(mid_keys)
    done
done
echo

echo "== staged only (every pageable copy through the ring), time over the driver's, in the"
echo "   same runs: lower is better; below 1 staging wins, so direct_max belongs just below"
echo "   the smallest size under 1"
printf '%-24s' "first piece, pieces"
for d in to from; do for s in 256K 512K 1M 2M 4M; do printf ' %7s' "$d$s"; done; done
echo
for first in 64K 128K 256K 512K; do
    for pieces in 1 4 8; do
        summary=${pieces_summary["$first, $pieces"]}
        row "$first, $pieces" $(staged_keys)
    done
done
echo

echo "== PINMEM_COPY_DIRECT_MAX (the driver's own path up to it), default pieces and 128K x 8"
mid_header "direct_max, pieces"
for direct in 256K 512K 1M 2M; do
    run "direct_max $direct" mid quick PINMEM_COPY_DIRECT_MAX=$direct
    row "$direct" $(mid_keys)
    run "direct_max $direct, 128K x 8" mid quick PINMEM_COPY_DIRECT_MAX=$direct \
        PINMEM_COPY_FIRST_PIECE=128K PINMEM_COPY_PIECES=8
    row "$direct, 128K x 8" $(mid_keys)
done
echo

echo "== PINMEM_COPY_SPIN_US (workers look for work this long before they sleep), mid sizes"
echo "   and both ways at once at 64 MiB (both64M: the sum, % of two pinned copies at once)"
mid_header "spin" | sed 's/$/  both64M/'
for spin in -1 100 1000 2000; do
    run "spin $spin us" "mid both" quick PINMEM_COPY_SPIN_US=$spin
    row "$spin" $(mid_keys) both.64M
done
echo

echo "== PINMEM_COPY_CHUNK (the largest piece, one buffer): fewer, larger DMAs"
mid_header "chunk" | sed 's/$/  both64M/'
for chunk in 2M 4M 8M; do
    run "chunk $chunk" "mid both" quick PINMEM_COPY_CHUNK=$chunk
    row "$chunk" $(mid_keys) both.64M
done
echo

echo "== PINMEM_COPY_RING: both ways at once, the sum as a % of two pinned copies at once"
printf '%-24s %7s %7s %7s\n' "ring" both64M both256M both1G
for ring in split shared; do
    run "ring $ring" both full PINMEM_COPY_RING=$ring
    row "$ring" both.64M both.256M both.1G
done
echo

echo "== PINMEM_COPY_BATCH: 1,000 scattered blocks each way; % of one contiguous pinned copy"
echo "   (pageable blocks; \"pinned\": page-locked blocks), and x the driver's copy a block"
printf '%-24s' "batch"
for b in 256K 64K 16K-2M; do for d in to from; do printf ' %7s %7s %7s' "$b$d" x pinned; done; done
echo
for batch in gather each driver kernel; do
    run "batch $batch" batch full PINMEM_COPY_BATCH=$batch
    keys=()
    for b in 256K 64K 16K-2M; do for d in htod dtoh; do keys+=("batch.$b.$d" "batch.$b.$d.x" "batch.$b.$d.pinned"); done; done
    row "$batch" "${keys[@]}"
done
echo
echo "Finished $(date -u +%H:%M:%SZ), $(($(date +%s) - start)) s after the start."
echo
echo "================================================================ every run's output"
cat "$work/raw.txt"
} >"$OUT/sweep.txt"
sed -n '1,/^================/p' "$OUT/sweep.txt"
