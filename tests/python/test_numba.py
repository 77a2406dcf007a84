"""pinmem.numba: the EMM plugin (needs Numba's CUDA target and a GPU). Numba's
own test files run with the plugin in bench/gpu.sh."""

import ctypes

import pytest

from conftest import requires_cuda

numba_cuda = pytest.importorskip("numba.cuda", reason="Numba's CUDA target is not installed here")
pytestmark = requires_cuda

import pinmem  # noqa: E402

_DEVICEMAP = 0x2


def _use(ctx, manager_class):
    """Gives the context a fresh memory manager of manager_class."""
    ctx.reset()
    ctx.memory_manager = manager_class(context=ctx)
    ctx.memory_manager.initialize()


def _outcome(fn):
    """What fn does: returns, or raises (which exception type)."""
    try:
        fn()
    except Exception as e:  # compared, not hidden: see the callers
        return ("raised", type(e))
    return ("returned", None)


def _pinmem_flags(address):
    f = ctypes.c_uint()
    assert pinmem._lib.load().pm_mem_host_get_flags(ctypes.byref(f), address) == 0, \
        "pinmem does not know this memory"
    return f.value


def test_plugin_class():
    pn = pinmem.numba
    assert pn._numba_memory_manager is pn.PinmemMemoryManager
    assert pn.PinmemMemoryManager(context=None).interface_version == 1


def test_host_allocations_come_from_pinmem():
    import numpy as np
    from numba import cuda
    from numba.cuda.cudadrv import driver

    cuda.set_memory_manager(pinmem.numba.PinmemMemoryManager)
    ctx = cuda.current_context()
    _use(ctx, pinmem.numba.PinmemMemoryManager)
    a = cuda.pinned_array(1 << 16, dtype=np.float32)
    _pinmem_flags(a.ctypes.data)
    a[:] = 3
    d = cuda.to_device(a)
    # A mapped array is read and written as Numba's own tests do (a
    # MappedNDArray is no copy_to_host destination: see the test below).
    b = cuda.mapped_array(1 << 16, dtype=np.float32)
    assert _pinmem_flags(b.ctypes.data) & _DEVICEMAP
    driver.device_to_host(b, d, d.alloc_size)
    assert (b == 3).all()
    driver.device_memset(b, 0, driver.device_memory_size(b))
    assert (b == 0).all()
    x = np.arange(1 << 18, dtype=np.float64)
    with cuda.pinned(x):
        dx = cuda.to_device(x)
        assert (dx.copy_to_host() == x).all()
    with cuda.mapped(x) as mx:
        assert _pinmem_flags(x.ctypes.data) & _DEVICEMAP
        driver.device_memset(mx, 0, x.nbytes)
        assert (x == 0).all()
    del a, b, d, dx
    ctx.reset()


def test_mapped_arrays_are_numbas_own():
    """cuda.mapped_array wraps whatever memhostalloc returns in a
    MappedNDArray of its own making: with the plugin, the array and its
    memory object are of the kinds Numba's own manager gives, and every use
    has the outcome it has under Numba's own manager. That includes
    copy_to_host into a mapped array, which numba-cuda 0.30 fails with
    AttributeError ('_dummy', which its MappedNDArray never sets) whoever
    allocated the memory."""
    import numpy as np
    from numba import cuda
    from numba.cuda.cudadrv import driver
    from numba.cuda.cudadrv.devicearray import MappedNDArray

    ctx = cuda.current_context()
    before = type(ctx.memory_manager)
    seen = {}
    try:
        for name, manager in (("numba", driver.NumbaCUDAMemoryManager),
                              ("pinmem", pinmem.numba.PinmemMemoryManager)):
            _use(ctx, manager)
            b = cuda.mapped_array((64, 1024), dtype=np.float32)
            d = cuda.to_device(np.full((64, 1024), 3, dtype=np.float32))
            assert isinstance(b, MappedNDArray)
            uses = (
                lambda: d.copy_to_host(b),
                lambda: b.squeeze(),
                lambda: b[3:5],
                lambda: b + 1,
            )
            seen[name] = (type(b), type(b.gpu_data), type(b.gpu_data.owner), b.gpu_data.size,
                          tuple(_outcome(u) for u in uses))
            if name == "pinmem":
                assert _pinmem_flags(b.ctypes.data) & _DEVICEMAP
            del b, d, uses
    finally:
        _use(ctx, before)
    assert seen["pinmem"] == seen["numba"]
