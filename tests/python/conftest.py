"""Shared set-up for the Python suites: the package from python/ (unless an
installed one is asked for with PINMEM_TEST_INSTALLED=1), the library from
PINMEM_LIBRARY or the build tree, and skips with a reason for what the
machine lacks."""

import gc
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if os.environ.get("PINMEM_TEST_INSTALLED") != "1":
    sys.path.insert(0, str(ROOT / "python"))

import pinmem  # noqa: E402


def backend():
    return pinmem.backend()


def is_cuda():
    return backend() == "cuda"


def memlock_headroom():
    """Bytes this process may still lock on the posix backend (None: no limit
    binds, or the cuda backend, which ignores it)."""
    if is_cuda():
        return None
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (ImportError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY or os.geteuid() == 0:
        return None
    locked = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmLck:"):
                locked = int(line.split()[1]) * 1024
    return max(soft - locked, 0)


def optional(module):
    """The module, or a skip saying it is missing."""
    return pytest.importorskip(module, reason=f"{module} is not installed here")


requires_cuda = pytest.mark.skipif("not __import__('conftest').is_cuda()",
                                   reason="needs the cuda backend (a GPU and its driver)")


@pytest.fixture(autouse=True)
def _collect():
    yield
    gc.collect()  # buffers a failed test left behind go back before the next test


def pytest_report_header(config):
    try:
        return [f"pinmem: {pinmem.library_path()} (backend {pinmem.backend()})"]
    except Exception as e:  # the tests will say more
        return [f"pinmem: {e}"]


def skip_unless_pools_fit():
    """Skips when pool memory cannot be pinned under this user's memlock limit
    (an ordinary user's 8 MiB): the pool pins whole granules or chunks."""
    if memlock_headroom() is None:
        return
    try:
        with pinmem.Pool() as pool:
            pool.alloc(4096).close()
    except pinmem.PinmemMemoryError as e:
        pytest.skip(f"pool memory is past this user's memlock limit ({e.detail[:120]})")


def host_memory(kind, nbytes):
    """nbytes of host memory of a kind, "pageable" (a bytearray) or "pinned"
    (a pinmem.Buffer; skipped where pools cannot pin), and a byte view of it."""
    if kind == "pinned":
        skip_unless_pools_fit()
    host = bytearray(nbytes) if kind == "pageable" else pinmem.empty(nbytes)
    return host, memoryview(host).cast("B")
