#!/usr/bin/env bash
# One call on the GPU machine: pageable copies of a process held to a few
# CPUs, with the workers the engine counts now (one per CPU it may use but
# the caller's) against 15, the count it took from a 16-CPU machine before:
# under taskset, and under a cgroup v2 CPU quota where root may make one
# here. Interleaved passes of `pinmem bench copy --quick` (sizes up to 64
# MiB), each a line of its shares of pinned at 1-64 MiB both ways, and one
# unrestricted run a pass beside them; then back-to-back 256 MiB copies for
# 2 s each way (bench/probe/sustained_copy.c): their rate, the CPUs busy and
# how late another thread wakes meanwhile, as a quota's throttling shows,
# and the driver's own pageable path beside them for its CPU time.
# CPUS_ALLOWED (default 4) and PASSES (default 3) set the shape. Then
# (section "bound") a PyTorch process whose main thread OpenMP binds to one
# CPU (OMP_PROC_BIND=close), with and without PINMEM_THREAD_CPUS=process,
# beside one unbound (bench/probe/bound_main_thread.py), PASSES times.
# Section "caller": whether leaving the calling thread a CPU of its own
# speeds small copies: the bench's threads held to CPU 0 by taskset while
# PINMEM_THREAD_CPUS=process puts pinmem's on the other CPUs, beside the
# default, PASSES times interleaved.
# SECTIONS (default "limits bound") picks. Builds build-gpu's pinmem and the
# probe where needed; writes only $OUT/cpus.txt (default: a new directory
# under ${TMPDIR:-/tmp}).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/pinmem-gpu-cpus.XXXXXX")}
mkdir -p "$OUT"
echo "results: $OUT/cpus.txt"
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPINMEM_BUILD_PROBES=ON >/dev/null 2>&1 &&
    cmake --build build-gpu -j"$(nproc)" --target pinmem_cli pinmem_shared probe_sustained_copy >/dev/null 2>&1 ||
    { echo "build failed"; exit 1; }
pinmem=$PWD/build-gpu/tools/pinmem
sustained=$PWD/build-gpu/bench/probe/probe_sustained_copy
n=${CPUS_ALLOWED:-4}
passes=${PASSES:-3}
sections=${SECTIONS:-limits bound}
py=${PINMEM_PYTHON:-/opt/torch/.venv/bin/python}
[ -x "$py" ] || py=$(command -v python3)

# The summary's shares of pinned at 1-64 MiB, from a run's output.
shares() {
    sed -n 's/^summary: //p' | tr ' ' '\n' | grep -E '^(htod|dtoh)\.(1M|4M|16M|64M)=' | tr '\n' ' '
}

# run LABEL COMMAND...: one bench, its line.
run() {
    local label=$1
    shift
    echo "$label: $(PINMEM_BENCH_COPY="sizes summary" "$@" "$pinmem" bench copy --quick 2>&1 | shares)"
}

# A cgroup v2 of n CPUs' quota, where this machine lets root make one.
quota=/sys/fs/cgroup/pinmem-quota
in_quota=()
if grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null &&
    { grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control ||
        echo +cpu >/sys/fs/cgroup/cgroup.subtree_control; } 2>/dev/null &&
    mkdir -p "$quota" 2>/dev/null && echo "$((n * 100000)) 100000" >"$quota/cpu.max" 2>/dev/null; then
    in_quota=(bash -c 'echo $$ >"$0"/cgroup.procs && exec "$@"' "$quota")
fi

limits_section() {
    where="no cgroup quota can be made here"
    [ ${#in_quota[@]} -eq 0 ] || where="cgroup $quota"
    echo "cpus: $(nproc), held to $n by taskset -c 0-$((n - 1)) and by a quota of $n CPUs ($where)"
    echo "each line: pinmem's pageable copies as % of pinned (htod: to the device, dtoh: from it)"
    for pass in $(seq "$passes"); do
        run "pass $pass, all CPUs, default workers" env
        for workers in default 15; do
            w=()
            [ "$workers" = 15 ] && w=(PINMEM_COPY_WORKERS=15)
            run "pass $pass, taskset $n CPUs, $workers workers" env "${w[@]}" taskset -c "0-$((n - 1))"
            [ ${#in_quota[@]} -eq 0 ] ||
                run "pass $pass, quota $n CPUs, $workers workers" "${in_quota[@]}" env "${w[@]}"
        done
    done
    echo "back-to-back 256 MiB copies, 2 s each way"
    for dir in htod dtoh; do # the driver's own pageable path, for its CPU time
        echo "all CPUs, the driver's own path: $(PINMEM_COPY_DIRECT_MAX=1G PINMEM_COPY_DTOH_DIRECT_MAX=1G \
            "$sustained" 2 256 "$dir" 2>&1)"
    done
    for workers in default 15; do
        w=()
        [ "$workers" = 15 ] && w=(PINMEM_COPY_WORKERS=15)
        for dir in htod dtoh; do
            echo "all CPUs: $(env "${w[@]}" "$sustained" 2 256 "$dir" 2>&1)"
            echo "taskset $n CPUs: $(env "${w[@]}" taskset -c "0-$((n - 1))" "$sustained" 2 256 "$dir" 2>&1)"
            [ ${#in_quota[@]} -eq 0 ] ||
                echo "quota $n CPUs: $("${in_quota[@]}" env "${w[@]}" "$sustained" 2 256 "$dir" 2>&1)"
        done
    done
}

bound_section() {
    local probe=bench/probe/bound_main_thread.py
    echo "a PyTorch process whose main thread OpenMP binds ($("$py" --version 2>&1))"
    for pass in $(seq "$passes"); do
        for setting in unbound bound bound-process; do
            local e=(PINMEM_LIBRARY="$PWD/build-gpu/libpinmem.so" PYTHONPATH="$PWD/python")
            [ "$setting" = unbound ] || e+=(OMP_PROC_BIND=close)
            [ "$setting" = bound-process ] && e+=(PINMEM_THREAD_CPUS=process)
            env "${e[@]}" "$py" "$probe" "pass $pass, $setting" 2>&1 | tail -3
        done
    done
}

caller_section() {
    echo "each line: pinmem's pageable copies as % of pinned (htod: to the device, dtoh: from it)"
    for pass in $(seq "$passes"); do
        run "pass $pass, default" env
        run "pass $pass, caller on CPU 0, pinmem's threads on the others" \
            env PINMEM_THREAD_CPUS=process taskset -c 0
    done
}

{
    date -u +"date: %Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    for section in $sections; do
        "${section}_section"
    done
} | tee "$OUT/cpus.txt"
[ ${#in_quota[@]} -eq 0 ] || rmdir "$quota" 2>/dev/null
