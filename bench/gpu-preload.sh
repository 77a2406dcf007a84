#!/usr/bin/env bash
# The preload library (libpinmem_preload.so) and pinmem.torch.install() with
# unmodified PyTorch on the GPU machine; bench/gpu.sh runs it at its end, and
# it runs alone after a build: bash bench/gpu-preload.sh [BUILD_DIR]
# (default build-gpu). bench/gpu_preload.py runs every check in fresh
# processes, without and with the preload (or install()), side by side:
#   preload: cold torch.empty(1 GiB, pin_memory=True) (target 8x faster);
#     x.to('cuda') and x.to('cuda', non_blocking=True) from a pageable 1 GiB
#     tensor (target 5x), bytes equal; a pageable source overwritten after a
#     non_blocking copy returns; .cpu() after a kernel; torch.cuda.graph
#     capture and replay of a pinned copy; a capture while another thread
#     copies; a DataLoader with pin_memory=True, num_workers=4; a CuPy
#     script; the runtime's answers and last errors, call by call, and
#     inside a host function the runtime runs, and after it;
#   install(): 24 pinned tensors of 2.08 GiB (fewer when the machine lacks
#     the memory, said in the table), cold 1 GiB pinned tensor (target 8x),
#     reuse behind torch.cuda._sleep, graph capture and replay, a DataLoader.
# It ends with a table of PASS/FAIL and the speed-ups; the exit status is 1
# when a check failed. PINMEM_PYTHON picks the interpreter (default:
# /opt/torch/.venv/bin/python, else python3); PINMEM_PRELOAD_RUNS the
# processes per timed figure (3).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
py=${PINMEM_PYTHON:-/opt/torch/.venv/bin/python}
[ -x "$py" ] || py=$(command -v python3)
preload=$("./$build/tools/pinmem" preload-path) || {
    echo "no preload library in $build: build it first (cmake --build $build)"
    exit 1
}
echo "== $("$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1)"
echo "== pinmem preload-path: $preload"
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export PINMEM_LIBRARY=$PWD/$build/libpinmem.so
unset PINMEM_PRELOAD PINMEM_BACKEND
"$py" bench/gpu_preload.py --preload "$preload" --runs "${PINMEM_PRELOAD_RUNS:-3}"
