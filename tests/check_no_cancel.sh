#!/bin/sh
# No pinmem call is a cancellation point (pinmem.h, "Threads"): every function
# the header declares turns the caller's cancellation off first
# (PM__NO_CANCEL, src/no_cancel.h), but for those named below.
#
#   check_no_cancel.sh HEADER SOURCE_DIR
set -eu
header=$1
src=$2
# Calls that only read constants or the thread's own variables, and the
# pools' fast paths, whose slow paths (alloc_general, free_general,
# pm__pool_alloc, pm__pool_free) turn it off: two more system calls would
# cost more than the pair they serve.
exempt="pm_dlpack_deleter pm_last_driver_error pm_last_error_detail pm_result_name
pm_result_string pm_version pm_version_string pm_mem_alloc_from_pool pm_mem_free
pm_mem_alloc_from_pool_async pm_mem_free_async"
declared=$(grep -oE '^PM_API [^(]*\b(pm_[a-z_0-9]+)\(' "$header" | grep -oE 'pm_[a-z_0-9]+\($' | tr -d '(')
# Each public definition in the sources: "NAME yes" when its body (from its
# signature to the first closing brace alone on a line) turns it off.
defined=$(find "$src" -name '*.c' -exec awk '
    !name && /^[a-z]/ && !/;[ \t]*$/ && match($0, /[ *]pm_[a-z_0-9]+\(/) {
        name = substr($0, RSTART + 1, RLENGTH - 2); off = "no"
    }
    name && /PM__NO_CANCEL/ { off = "yes" }
    name && /^}/ { print name, off; name = "" }' {} +)
failed=0
for name in $declared; do
    case " $(echo $exempt) " in *" $name "*) continue ;; esac
    answer=$(printf '%s\n' "$defined" | awk -v n="$name" '$1 == n { print $2; exit }')
    if [ -z "$answer" ]; then
        echo "$name: no definition found under $src"
        failed=1
    elif [ "$answer" != yes ]; then
        echo "$name: does not turn cancellation off (PM__NO_CANCEL)"
        failed=1
    fi
done
[ "$failed" = 0 ] && echo "every call pinmem.h declares turns cancellation off, but the exempt ones"
exit "$failed"
