#!/usr/bin/env bash
# Makes sure the tools the build needs are here: cmake, a C compiler, make,
# nm (binutils, for the exports test) and pkg-config (for the install test);
# with --plot also gnuplot, which draws the main job's copy plot. What is
# missing is installed with apt-get (Debian, Ubuntu) as root or through sudo
# without a password, and nothing else: no recommended packages. apt-get's
# output goes to a log shown only when it fails, so that pinmem's own output
# comes first. Where nothing can be installed, it says what is missing: a
# missing build tool fails, a missing gnuplot only means no plot.
set -euo pipefail
plot=false
[ "${1:-}" != "--plot" ] || plot=true

need=()
want=()
look() {
    need=()
    want=()
    command -v cmake >/dev/null || need+=(cmake)
    command -v cc >/dev/null || need+=(gcc)
    command -v make >/dev/null || need+=(make)
    command -v nm >/dev/null || need+=(binutils)
    command -v pkg-config >/dev/null || need+=(pkg-config)
    ! $plot || command -v gnuplot >/dev/null || want+=(gnuplot-nox)
}
look
[ $((${#need[@]} + ${#want[@]})) -gt 0 ] || exit 0

as_root=()
can_install=false
if command -v apt-get >/dev/null; then
    if [ "$(id -u)" -eq 0 ]; then
        can_install=true
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        as_root=(sudo -n)
        can_install=true
    fi
fi
if $can_install; then
    packages=("${need[@]}" "${want[@]}")
    log=$(mktemp "${TMPDIR:-/tmp}/pinmem-apt.XXXXXX")
    echo "installing ${packages[*]} with apt-get (quietly)" >&2
    if "${as_root[@]}" apt-get update -q >"$log" 2>&1 &&
        "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            --no-install-recommends "${packages[@]}" >>"$log" 2>&1; then
        rm -f "$log"
    else
        echo "apt-get failed; the end of its log ($log):" >&2
        tail -n 25 "$log" >&2
    fi
    look
fi
if [ ${#need[@]} -gt 0 ]; then
    echo "missing, and needed to build pinmem: ${need[*]}" \
        "(as root: apt-get install --no-install-recommends ${need[*]})" >&2
    exit 1
fi
[ ${#want[@]} -eq 0 ] ||
    echo "gnuplot is missing, so there will be no plot (Debian package gnuplot-nox)" >&2
