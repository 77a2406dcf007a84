#!/bin/sh
# tools/ builds against the public API alone: each file includes system
# headers (<...>), "pinmem.h" and headers of tools/ itself, and names no
# internal pm__ function or type.
set -eu
tools=$1/tools
bad=0
for f in "$tools"/*.c "$tools"/*.h; do
    grep -n '^[[:space:]]*#[[:space:]]*include' "$f" | while IFS= read -r line; do
        inc=$(printf '%s\n' "$line" | sed -E 's/^[0-9]+:[[:space:]]*#[[:space:]]*include[[:space:]]*//')
        case $inc in
        \<*\>*) ;;
        '"pinmem.h"'*) ;;
        \"*\"*)
            name=$(printf '%s\n' "$inc" | sed -E 's/^"([^"]*)".*/\1/')
            case $name in
            */*) echo "${f#"$1"/}:${line%%:*}: includes $name, outside tools/"; exit 1 ;;
            esac
            [ -f "$tools/$name" ] || { echo "${f#"$1"/}:${line%%:*}: includes $name, not a header of tools/"; exit 1; }
            ;;
        *) echo "${f#"$1"/}:${line%%:*}: an include this check cannot read: $inc"; exit 1 ;;
        esac
    done || bad=1
    if grep -q 'pm__' "$f"; then
        grep -n 'pm__' "$f" | head -3 | sed "s|^|${f#"$1"/}:|"
        echo "${f#"$1"/}: names pinmem internals (pm__)"
        bad=1
    fi
done
[ $bad -eq 0 ] || exit 1
echo "tools/ includes only system headers, pinmem.h and its own headers"
