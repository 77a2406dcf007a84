#!/usr/bin/env bash
# Runs one scenario of the preload tests (see CMakeLists.txt):
#   run.sh SCENARIO BIN_DIR PRELOAD_LIBRARY SANITIZERS C_COMPILER
# Every scenario uses the stand-in runtime (libcudart.so.13 in BIN_DIR/fake)
# on pinmem's POSIX backend. Under sanitizers, their runtime is preloaded
# first, as a sanitized library needs.
set -uo pipefail
scenario=$1 bin=$2 preload=$3 sanitize=${4:-} cc=${5:-cc}

export PINMEM_BACKEND=posix PINMEM_COPY_DIRECT_MAX=64K
export LD_LIBRARY_PATH=$bin/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset PINMEM_PRELOAD PINMEM_STATS PINMEM_PINNED_BUDGET PINMEM_LIBRARY
runtime=
case $sanitize in
*address*) runtime=$("$cc" -print-file-name=libasan.so) ;;
*thread*) runtime=$("$cc" -print-file-name=libtsan.so) ;;
esac
with_preload=${runtime:+$runtime:}$preload
err=$(mktemp)
trap 'rm -f "$err"' EXIT

fail() {
    echo "FAILED: $*"
    echo "--- stderr:"
    head -40 "$err"
    exit 1
}

# Runs "$@" under the preload, stderr into $err.
preloaded() { LD_PRELOAD=$with_preload "$@" 2>"$err"; }

# Fails unless the preload said nothing, or said what the argument matches,
# exactly once.
said() {
    local n
    n=$(grep -c "^pinmem preload: " "$err")
    if [ -z "${1:-}" ]; then
        [ "$n" = 0 ] || fail "the preload spoke: $(grep '^pinmem preload' "$err" | head -3)"
    else
        [ "$n" = 1 ] && grep -q "$1" "$err" || fail "expected one message matching '$1', got $n"
    fi
}

case $scenario in
none)
    # The cases' expectations hold for the runtime alone.
    "$bin/test_preload" || exit 1
    ;;
all | alloc | copy | off)
    PINMEM_PRELOAD=$scenario preloaded "$bin/test_preload" || fail "test_preload"
    said
    ;;
bad-mode)
    PINMEM_PRELOAD=everything preloaded "$bin/test_preload" || fail "test_preload"
    said "PINMEM_PRELOAD=everything is not off, alloc, copy or all; using all"
    ;;
children)
    # Programs without CUDA start and run as ever, and the preload is silent.
    export ASAN_OPTIONS=detect_leaks=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}
    preloaded /bin/true || fail "/bin/true"
    said
    out=$(preloaded /bin/sh -c 'echo started; /bin/true && echo child ok') || fail "/bin/sh"
    [ "$out" = "started
child ok" ] || fail "sh printed: $out"
    said
    out=$(PINMEM_PRELOAD=all PINMEM_STATS=1 preloaded env) || fail "env"
    grep -q '^PINMEM_PRELOAD=all$' <<<"$out" || fail "env lost its environment"
    said
    ;;
loader)
    preloaded "$bin/test_preload_loader" load || fail "load"
    said
    PINMEM_PRELOAD=off preloaded "$bin/test_preload_loader" load || fail "load, off"
    said
    ;;
fallback)
    PINMEM_PINNED_BUDGET=2M preloaded "$bin/test_preload_loader" fallback || fail "fallback"
    said "pinmem could not serve cudaMallocHost (PM_ERROR_OUT_OF_MEMORY: .*budget.*); the CUDA runtime's own call did$"
    ;;
stats)
    PINMEM_STATS=1 preloaded "$bin/test_preload_loader" stats || fail "stats"
    grep -q "^pinmem preload (pid [0-9]*, PINMEM_PRELOAD=all)" "$err" || fail "no statistics"
    grep -Eq "^  cudaMallocHost +3 +9\.0 MiB +0 +0$" "$err" || fail "cudaMallocHost's line"
    grep -Eq "^  cudaFreeHost +3 +9\.0 MiB +1 +0$" "$err" || fail "cudaFreeHost's line"
    ;;
runtimes)
    "$bin/test_preload_loader" runtimes || fail "without the preload"
    for mode in all off; do
        PINMEM_PRELOAD=$mode preloaded "$bin/test_preload_loader" runtimes || fail "PINMEM_PRELOAD=$mode"
        said
    done
    ;;
elf)
    # No dependency on the runtime or on libpinmem, and exactly the
    # interposed functions exported: by default (PINMEM_PRELOAD) and for
    # each runtime version.
    if readelf -d "$preload" | grep NEEDED | grep -Eq 'cudart|pinmem\.so'; then
        readelf -d "$preload" | grep NEEDED
        fail "the preload declares a dependency it must not"
    fi
    exported=$(nm -D --defined-only "$preload" | awk '$2 == "T" {print $3}' | sort | tr '\n' ' ')
    want=
    for f in cudaFreeHost cudaHostAlloc cudaHostGetDevicePointer cudaHostGetFlags cudaHostRegister \
        cudaHostUnregister cudaMallocHost cudaMemcpy cudaMemcpyAsync cudaMemcpyAsync_ptsz cudaMemcpy_ptds; do
        want+="$f@@PINMEM_PRELOAD $f@libcudart.so.11.0 $f@libcudart.so.12 $f@libcudart.so.13 "
    done
    want=$(tr ' ' '\n' <<<"$want" | sed '/^$/d' | sort | tr '\n' ' ')
    [ "$exported" = "$want" ] || fail "exported: $exported"
    ;;
install)
    # As installed: pinmem preload-path names the installed library, which
    # loads the libpinmem.so installed beside it.
    prefix=$(mktemp -d)
    trap 'rm -rf "$prefix" "$err"' EXIT
    cmake --install "$bin/../.." --prefix "$prefix" >/dev/null || fail "cmake --install"
    printed=$("$prefix/bin/pinmem" preload-path) || fail "pinmem preload-path"
    installed=$(realpath "$(find "$prefix" -name libpinmem_preload.so | head -n 1)")
    [ "$printed" = "$installed" ] || fail "preload-path printed $printed, installed is $installed"
    with_preload=${runtime:+$runtime:}$installed
    preloaded "$bin/test_preload_loader" load || fail "load, installed"
    said
    ;;
*)
    echo "run.sh: unknown scenario $scenario"
    exit 2
    ;;
esac
echo "preload $scenario: passed"
