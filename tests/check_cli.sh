#!/bin/sh
# The pinmem command's conventions: help and the version on stdout with
# status 0; a command or option it does not know named on stderr, with the
# usage, and status 2; --plot refused where nothing is plotted, or under a
# name gnuplot cannot quote; output that cannot be written fails.
set -u
pinmem=$1 # and $2, the version it should print
dir=$(mktemp -d "${TMPDIR:-/tmp}/pinmem-cli.XXXXXX")
trap 'rm -rf "$dir"' EXIT
failures=0

fail() {
    echo "FAILED: pinmem $1: $2"
    failures=$((failures + 1))
}

# expect STATUS STREAM WORD ARGS...: the status, and WORD in STREAM (out or
# err); the other stream must stay empty.
expect() {
    want=$1 stream=$2 word=$3
    shift 3
    "$pinmem" "$@" >"$dir/out" 2>"$dir/err"
    got=$?
    [ "$got" -eq "$want" ] || fail "$*" "status $got, not $want"
    other=err
    [ "$stream" = out ] || other=out
    grep -qF -- "$word" "$dir/$stream" || fail "$*" "'$word' not on std$stream"
    [ ! -s "$dir/$other" ] || fail "$*" "std$other is not empty: $(head -1 "$dir/$other")"
}

version=$2
expect 0 out "pinmem $version" --version
expect 0 out "pinmem $version" version
expect 0 out "usage: pinmem" --help
expect 0 out "usage: pinmem" -h
expect 0 out "usage: pinmem" help
expect 0 out "usage: pinmem bench" bench --help
expect 0 out "usage: pinmem bench" bench copy -h
expect 0 out "backend:" info
expect 2 err "usage: pinmem" # no command at all
expect 2 err "'frobnicate'" frobnicate
expect 2 err "usage: pinmem" frobnicate
expect 2 err "'--frobnicate'" --frobnicate
expect 2 err "'--frobnicate'" bench --frobnicate
expect 2 err "usage: pinmem bench" bench --frobnicate
expect 2 err "'frobnicate'" bench frobnicate
expect 2 err "'extra'" info extra
expect 2 err "'extra'" --version extra
expect 2 err "--plot" bench pool --plot "$dir/pool.png"
expect 2 err "--plot" bench --quick --plot "$dir/host.png"
expect 2 err "--plot" bench copy --plot
expect 2 err "--plot" bench copy --plot "$dir/no/such/dir/copy.png"
expect 2 err "quotes" bench copy --plot "$dir/x';touch $dir/INJECTED;'.png"
expect 2 err "longer than" bench copy --plot "$dir/$(printf '%05000d' 0).png"
[ ! -e "$dir/INJECTED" ] || fail "bench copy --plot" "ran a command from the file name"
export PINMEM_BENCH_COPY="sizes sizez"
expect 2 err "'sizez'" bench copy
unset PINMEM_BENCH_COPY
expect 2 err "each once" bench copy --devices 0,0
expect 2 err "each once" bench copy --devices 0,
expect 2 err "--quick" bench footprint --quick
expect 2 err "one benchmark" bench copy pool
[ ! -e "$dir/pool.png" ] && [ ! -e "$dir/pool.png.dat" ] || fail "bench pool --plot" "wrote a file"
# Output that cannot be written fails the command.
for cmd in version preload-path; do
    if [ -w /dev/full ] && "$pinmem" $cmd >/dev/full 2>"$dir/err"; then
        fail "$cmd >/dev/full" "status 0"
    fi
done

if [ $failures -ne 0 ]; then
    echo "$failures CLI check(s) failed"
    exit 1
fi
echo "pinmem's help, version, errors and --plot behave"
