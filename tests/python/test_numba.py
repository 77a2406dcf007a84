"""pinmem.numba: the EMM plugin (needs Numba's CUDA target and a GPU). Numba's
own test files run with the plugin in bench/gpu.sh."""

import pytest

from conftest import requires_cuda

numba_cuda = pytest.importorskip("numba.cuda", reason="Numba's CUDA target is not installed here")
pytestmark = requires_cuda

import pinmem  # noqa: E402


def test_plugin_class():
    pn = pinmem.numba
    assert pn._numba_memory_manager is pn.PinmemMemoryManager
    assert pn.PinmemMemoryManager(context=None).interface_version == 1


def test_host_allocations_come_from_pinmem():
    import numpy as np
    from numba import cuda

    cuda.set_memory_manager(pinmem.numba.PinmemMemoryManager)
    ctx = cuda.current_context()
    ctx.reset()
    ctx.memory_manager = pinmem.numba.PinmemMemoryManager(context=ctx)
    ctx.memory_manager.initialize()
    a = cuda.pinned_array(1 << 16, dtype=np.float32)
    flags = pinmem._lib.load()
    import ctypes

    f = ctypes.c_uint()
    assert flags.pm_mem_host_get_flags(ctypes.byref(f), a.ctypes.data) == 0  # pinmem knows it
    a[:] = 3
    d = cuda.to_device(a)
    b = cuda.mapped_array(1 << 16, dtype=np.float32)
    d.copy_to_host(b)
    assert (b == 3).all()
    x = np.arange(1 << 18, dtype=np.float64)
    with cuda.pinned(x):
        dx = cuda.to_device(x)
        assert (dx.copy_to_host() == x).all()
    ctx.reset()
