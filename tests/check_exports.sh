#!/bin/sh
# The shared library exports exactly the functions the header declares.
set -eu
lib=$1
header=$2
exported=$(nm -D --defined-only "$lib" | awk '$2 == "T" { print $3 }' | sort)
declared=$(grep -oE '^PM_API [^(]*\b(pm_[a-z_0-9]+)\(' "$header" | grep -oE 'pm_[a-z_0-9]+\($' | tr -d '(' | sort)
if [ "$exported" != "$declared" ]; then
    echo "exported and declared symbols differ:"
    printf '%s\n' "$exported" > /tmp/pinmem_exported.$$
    printf '%s\n' "$declared" | diff /tmp/pinmem_exported.$$ - || true
    rm -f /tmp/pinmem_exported.$$
    exit 1
fi
echo "$(printf '%s\n' "$exported" | wc -l) symbols exported, all declared in pinmem.h"
