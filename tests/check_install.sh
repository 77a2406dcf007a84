#!/bin/sh
# cmake --install, then build a program against the installed package, once
# with find_package(pinmem) and once with pkg-config, and run both.
set -eu
build=$1
source=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$source/examples/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
LD_LIBRARY_PATH="$tmp/prefix/lib:$tmp/prefix/lib64" "$tmp/consumer/consumer"
pcdir=$(dirname "$(find "$tmp/prefix" -name pinmem.pc | head -n 1)")
flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs pinmem 2>/dev/null) ||
    { echo "pkg-config could not read the installed pinmem.pc"; exit 1; }
cc "$source/examples/consumer/main.c" $flags -o "$tmp/pc-consumer"
LD_LIBRARY_PATH="$(dirname "$pcdir")" "$tmp/pc-consumer"
