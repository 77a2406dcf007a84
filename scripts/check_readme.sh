#!/usr/bin/env bash
# The README's C and Python blocks are the example programs, verbatim: each
# ```c or ```python block comes right after a line "<!-- examples/NAME.c -->"
# (or examples/python/NAME.py) and must equal that file, which the tests build
# and run. So every snippet a reader copies compiles and works. The README
# also stays within 200 lines.
# Usage: scripts/check_readme.sh [SOURCE_DIR]
set -euo pipefail
root=${1:-$(dirname "$0")/..}
readme=$root/README.md
status=0
lines=$(wc -l <"$readme")
if [ "$lines" -gt 200 ]; then
    echo "README.md has $lines lines; keep it within 200"
    status=1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Writes block k to $tmp/k and the file it must equal (or "-") to $tmp/k.name.
awk -v dir="$tmp" '
    inside && /^```$/ { inside = 0; close(out); next }
    inside { print > out; next }
    /^```(c|python)[ \t]*$/ {
        k++; out = dir "/" k; inside = 1
        printf "" > out
        print (prev ~ /^<!-- examples\/[A-Za-z0-9_.\/-]+\.(c|py) -->$/ ? prev : "-") > (out ".name")
        close(out ".name")
    }
    { prev = $0 }
' "$readme"
blocks=0
for name_file in "$tmp"/*.name; do
    [ -e "$name_file" ] || break
    blocks=$((blocks + 1))
    block=${name_file%.name}
    marker=$(cat "$name_file")
    if [ "$marker" = "-" ]; then
        echo "README.md: code block $(basename "$block") has no <!-- examples/NAME --> line before it"
        status=1
        continue
    fi
    file=${marker#<!-- }
    file=${file% -->}
    if [ ! -f "$root/$file" ]; then
        echo "README.md: code block $(basename "$block") names $file, which does not exist"
        status=1
    elif ! diff -u "$root/$file" "$block" >"$tmp/diff"; then
        echo "README.md: the block after <!-- $file --> differs from the file:"
        head -40 "$tmp/diff"
        status=1
    fi
done
[ "$status" -ne 0 ] || echo "README.md: $lines lines, $blocks code blocks equal to their example files"
exit "$status"
