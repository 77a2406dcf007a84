#!/usr/bin/env bash
# The Python package on the GPU machine (bench/gpu.sh runs it last): installs
# python/ with the library of build directory $1 (default build-gpu) shipped
# inside it, then runs
#   1. tests/python against the installed package, on the CUDA backend and
#      on the POSIX backend;
#   2. Numba's own pinned-memory tests (test_emm_plugins, test_pinned,
#      test_host_alloc) with NUMBA_CUDA_MEMORY_MANAGER=pinmem.numba (where
#      the filecheck package that numba.cuda.testing imports is missing, a
#      stand-in for that run only: those three use none of it);
#   3. python -m pinmem bench.
# PINMEM_PYTHON picks the interpreter (default: /opt/torch/.venv/bin/python,
# else python3). Everything goes to standard output; the exit status is the
# number of parts that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
py=${PINMEM_PYTHON:-/opt/torch/.venv/bin/python}
[ -x "$py" ] || py=$(command -v python3)
site=$(mktemp -d /tmp/pinmem-python.XXXXXX)
failed=0
echo "== Python package: $("$py" --version 2>&1) at $py"
"$py" -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())" 2>&1
for mod in cupy numba numba_cuda cuda.core cuda.bindings numpy pytest; do
    "$py" -c "import importlib; m = importlib.import_module('$mod'); print('$mod', getattr(m, '__version__', '?'))" 2>&1 | tail -1
done

echo "== pip install ./python (offline, shipping $build/libpinmem.so)"
PINMEM_LIBRARY=$PWD/$build/libpinmem.so PIP_NO_INDEX=1 \
    "$py" -m pip install --no-build-isolation --no-deps --target "$site" ./python 2>&1 | tail -2 ||
    failed=$((failed + 1))
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
export PINMEM_TEST_INSTALLED=1
"$py" -m pinmem info 2>&1

echo "== tests/python, CUDA backend"
"$py" -m pytest -q -rs -p no:cacheprovider tests/python 2>&1 || failed=$((failed + 1))
echo "== tests/python, POSIX backend"
PINMEM_BACKEND=posix "$py" -m pytest -q -p no:cacheprovider tests/python 2>&1 | tail -3
[ "${PIPESTATUS[0]}" = 0 ] || failed=$((failed + 1))

echo "== Numba's pinned-memory tests with NUMBA_CUDA_MEMORY_MANAGER=pinmem.numba"
# numba.cuda.testing imports filecheck (for its FileCheck assertions) at the
# top; machines without it get a stand-in whose every name skips the test
# that uses it.
numba_path=$PYTHONPATH
if ! "$py" -c "import filecheck.matcher" >/dev/null 2>&1; then
    standin=$(mktemp -d /tmp/pinmem-filecheck.XXXXXX)
    mkdir "$standin/filecheck"
    cat >"$standin/filecheck/__init__.py" <<'PY'
"""A stand-in for the filecheck package, for one test run: every name is a
class whose use skips the test (numba.cuda.testing imports Matcher, Options,
Parser, pattern_for_opts and FInput, and uses them only in FileCheck
assertions)."""
import unittest


class _Missing:
    def __init__(self, *args, **kwargs):
        raise unittest.SkipTest("the filecheck package is not installed")

    def __call__(self, *args, **kwargs):
        raise unittest.SkipTest("the filecheck package is not installed")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (_Missing,), {})
PY
    for sub in matcher options parser finput; do
        echo "from filecheck import __getattr__  # noqa: F401" >"$standin/filecheck/$sub.py"
    done
    numba_path=$standin${numba_path:+:$numba_path}
    echo "filecheck is not installed: a stand-in from $standin is on PYTHONPATH for this run"
fi
NUMBA_CUDA_MEMORY_MANAGER=pinmem.numba PYTHONPATH=$numba_path "$py" -c "
from numba import cuda
import numba.cuda.testing
print('memory manager in use:', type(cuda.current_context().memory_manager).__module__,
      type(cuda.current_context().memory_manager).__name__)" 2>&1
NUMBA_CUDA_MEMORY_MANAGER=pinmem.numba PYTHONPATH=$numba_path "$py" -m unittest -v \
    numba.cuda.tests.cudadrv.test_emm_plugins numba.cuda.tests.cudadrv.test_pinned \
    numba.cuda.tests.cudadrv.test_host_alloc 2>&1 | tail -40
[ "${PIPESTATUS[0]}" = 0 ] || failed=$((failed + 1))
[ -z "${standin:-}" ] || rm -rf "$standin"

echo "== python -m pinmem bench"
"$py" -m pinmem bench 2>&1 || failed=$((failed + 1))
rm -rf "$site"
echo "== Python package: $failed part(s) failed"
exit "$failed"
