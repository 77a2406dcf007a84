#!/usr/bin/env bash
# Layers call downwards only: no object of the library refers to a function
# or variable defined in an object on a later line of the layer table
# (tests/layers.txt, docs/design.md).
#
#   check_layers.sh TABLE OBJECT...
#
# OBJECTs are the library's object files or directories holding them
# (tests/objects.sh).
set -euo pipefail
table=$1
shift
source "$(dirname "$0")/objects.sh"

# One line per symbol: "OBJECT D SYMBOL" where defined, "OBJECT U SYMBOL"
# where referred to but not defined.
symbols() {
    for o in "${objects[@]}"; do
        local name
        name=$(object_name "$o")
        nm -P -g "$o" | awk -v obj="$name" '
            NF >= 2 { print obj, (($2 == "U" || (($2 == "w" || $2 == "v") && NF == 2)) ? "U" : "D"), $1 }'
    done
}

symbols | awk -v table="$table" '
    BEGIN {
        level = 0
        while ((getline line < table) > 0) {
            sub(/#.*/, "", line)
            n = split(line, w, " ")
            if (n == 0)
                continue
            if (w[1] == "known") {
                if (n != 5 || w[3] != "->") {
                    printf "%s: cannot read: %s\n", table, line
                    bad = 1
                    continue
                }
                known[w[2] " " w[4] " " w[5]] = 0
                continue
            }
            level++
            for (i = 1; i <= n; i++)
                rank[w[i]] = level
        }
    }
    $2 == "D" { defined[$3] = $1; seen[$1] = 1; next }
    { refs[++nrefs] = $1 " " $3; seen[$1] = 1 }
    END {
        for (o in seen)
            if (!(o in rank)) {
                printf "src/%s.c is not in %s: add it to its layer\n", o, table
                bad = 1
            }
        for (i = 1; i <= nrefs; i++) {
            split(refs[i], r, " ")
            from = r[1]; sym = r[2]
            if (!(sym in defined))
                continue # the C library, the sanitizers, libdl
            to = defined[sym]
            if (to == from || !(from in rank) || !(to in rank) || rank[to] <= rank[from])
                continue
            key = from " " to " " sym
            if (key in known) {
                known[key]++
                continue
            }
            printf "src/%s.c refers to %s, defined in src/%s.c, a layer above it\n", from, sym, to
            bad = 1
        }
        for (k in known)
            if (known[k] == 0) {
                split(k, r, " ")
                printf "%s: \"known %s -> %s %s\" no longer happens: remove the line\n", table, r[1], r[2], r[3]
                bad = 1
            }
        if (bad)
            exit 1
        n = 0
        for (k in known)
            n++
        printf "every reference goes down a layer or stays on its own (%d known exceptions)\n", n
    }'
