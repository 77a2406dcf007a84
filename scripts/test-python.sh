#!/usr/bin/env bash
# The Python suites (tests/python) against the libpinmem.so of a build
# directory (default build-test; an AddressSanitizer one such as
# build-test-address-undefined works too, taking about 1.5 minutes), with
# Debian's python3 and its numpy, pytest and torch packages: installed when
# missing and we are root, otherwise named and whatever needs them skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build-test}
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
missing=()
for pkg in pytest numpy torch; do
    "$py" -c "import $pkg" 2>/dev/null || missing+=("python3-$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || ! sudo -n true 2>/dev/null || sudo="sudo -n"
    if { [ "$(id -u)" = 0 ] || [ -n "$sudo" ]; } && command -v apt-get >/dev/null; then
        echo "== installing ${missing[*]}"
        $sudo apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >/dev/null
    else
        echo "python tests: ${missing[*]} missing (install them as root: apt-get install ${missing[*]}); what needs them is skipped"
    fi
fi
if ! "$py" -c "import pytest" 2>/dev/null; then
    echo "skipped: the Python suites need pytest ($py -m pytest)"
    exit 0
fi
preload=
if [[ $dir == *address* ]]; then
    # An AddressSanitizer build of the library in an ordinary interpreter: the
    # runtime goes first; the interpreter's own leaks at exit are not ours.
    # libstdc++ is loaded at start too, or the runtime finds no __cxa_throw to
    # forward to and aborts at the first C++ exception (PyTorch's, say).
    preload="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so.6)"
    export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
fi
echo "== Python suites ($py, $dir/libpinmem.so)"
# Temporary files under the build directory: pytest's default,
# /tmp/pytest-of-$USER, belongs to whoever ran first and is refused to anyone
# else who inherits that USER (root's environment kept by setpriv or su).
LD_PRELOAD=$preload PINMEM_LIBRARY=$PWD/$dir/libpinmem.so PYTHONDONTWRITEBYTECODE=1 \
    "$py" -m pytest -q -rs -p no:cacheprovider --basetemp="$PWD/$dir/pytest-tmp" tests/python
