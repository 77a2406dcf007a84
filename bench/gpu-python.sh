#!/usr/bin/env bash
# The Python package on the GPU machine (bench/gpu.sh runs it last): installs
# python/ with the library of build directory $1 (default build-gpu) shipped
# inside it, then runs
#   1. tests/python against the installed package, on the CUDA backend and
#      on the POSIX backend;
#   2. Numba's own pinned-memory tests (test_emm_plugins, test_pinned,
#      test_host_alloc) with NUMBA_CUDA_MEMORY_MANAGER=pinmem.numba;
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
NUMBA_CUDA_MEMORY_MANAGER=pinmem.numba "$py" -c "
from numba import cuda
print('memory manager in use:', type(cuda.current_context().memory_manager).__module__,
      type(cuda.current_context().memory_manager).__name__)" 2>&1
NUMBA_CUDA_MEMORY_MANAGER=pinmem.numba "$py" -m unittest -v \
    numba.cuda.tests.cudadrv.test_emm_plugins numba.cuda.tests.cudadrv.test_pinned \
    numba.cuda.tests.cudadrv.test_host_alloc 2>&1 | tail -40
[ "${PIPESTATUS[0]}" = 0 ] || failed=$((failed + 1))

echo "== python -m pinmem bench"
"$py" -m pinmem bench 2>&1 || failed=$((failed + 1))
rm -rf "$site"
echo "== Python package: $failed part(s) failed"
exit "$failed"
