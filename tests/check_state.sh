#!/usr/bin/env bash
# The library keeps no state but what tests/state.txt names: every writable
# variable with static storage in its object files (in .data or .bss, so not
# thread-local and not constant) must be on its file's line, and every name
# there must still exist (docs/design.md, "Process-wide state").
#
#   check_state.sh TABLE OBJECT...
#
# OBJECTs are the library's object files or directories holding them
# (tests/objects.sh).
set -euo pipefail
table=$1
shift
source "$(dirname "$0")/objects.sh"

# One line per variable: "OBJECT NAME", a function's static without the
# number the compiler appends to its name; the sanitizers' own variables
# (named with two underscores first) left out.
variables() {
    for o in "${objects[@]}"; do
        objdump -t "$o" | awk -v obj="$(object_name "$o")" '
            {
                for (i = 2; i < NF; i++)
                    if ($i == "O") {
                        if ($(i + 1) ~ /^\.(data|bss)/ && $(i + 1) !~ /rel\.ro/ && $NF !~ /^__/) {
                            name = $NF
                            sub(/\.[0-9]+$/, "", name)
                            print obj, name
                        }
                        break
                    }
            }'
    done
}

variables | awk -v table="$table" '
    BEGIN {
        while ((getline line < table) > 0) {
            sub(/#.*/, "", line)
            n = split(line, w, " ")
            if (n == 0)
                continue
            if (w[1] !~ /:$/) {
                printf "%s: cannot read: %s\n", table, line
                bad = 1
                continue
            }
            file = substr(w[1], 1, length(w[1]) - 1)
            for (i = 2; i <= n; i++)
                listed[file " " w[i]] = 0
        }
    }
    {
        key = $1 " " $2
        if (key in listed) {
            listed[key]++
            next
        }
        printf "src/%s.c keeps %s, which %s does not name: make it constant, thread-local or part of a module'"'"'s state, and add it\n", $1, $2, table
        bad = 1
    }
    END {
        for (k in listed)
            if (listed[k] == 0) {
                split(k, r, " ")
                printf "%s names %s of src/%s.c, which the library no longer keeps: remove it\n", table, r[2], r[1]
                bad = 1
            }
        if (bad)
            exit 1
        n = 0
        for (k in listed)
            n++
        printf "the library keeps the %d variables %s names, and no others\n", n, table
    }'
