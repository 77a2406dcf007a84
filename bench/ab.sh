#!/usr/bin/env bash
# A/B on the GPU machine: the working tree ("b") against the same tree with
# PATCH applied ("a", usually the change reversed: git diff -R HEAD), both
# built outside the tree, `pinmem bench` run in turn so that drift hits both.
# Results land in $OUT/ab.txt (default: a new directory under ${TMPDIR:-/tmp});
# nothing is written into the tree. Usage: bench/ab.sh PATCH [passes] [bench names...]
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] && [ -f "$1" ] || { echo "usage: bench/ab.sh PATCH [passes] [bench names...]" >&2; exit 2; }
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/pinmem-ab.XXXXXX")}
mkdir -p "$OUT"
echo "results: $OUT/ab.txt"
patch_file=$(realpath "$1")
passes=${2:-4}
shift $(($# >= 2 ? 2 : 1))
benches=${*:-copy}
base=/tmp/pinmem-a
rm -rf "$base" && mkdir -p "$base"
tar --exclude='./build*' --exclude=./.git -cf - . | tar -xf - -C "$base"
(cd "$base" && patch -p1 -s <"$patch_file") || { echo "patch failed"; exit 1; }
for v in a b; do
    src=$PWD
    [ "$v" = a ] && src=$base
    cmake -S "$src" -B "/tmp/build-$v" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF \
        >/dev/null 2>&1 && cmake --build "/tmp/build-$v" -j"$(nproc)" >/dev/null 2>&1 ||
        { echo "build of $v failed"; exit 1; }
done
for pass in $(seq "$passes"); do
    for what in $benches; do
        for v in a b; do
            echo "== pass $pass, bench $what, variant $v"
            "/tmp/build-$v/tools/pinmem" bench "$what" 2>&1 |
                grep -E "^([0-9]+ [KMG]iB|[0-9]+ x |\((workers|pageable)|registration cache|pageable -> |device -> |both ways)"
        done
    done
done 2>&1 | tee "$OUT/ab.txt"
