"""pinmem.numba: a Numba External Memory Management plugin whose host
allocations come from pinmem.

memhostalloc (cuda.pinned_array, cuda.mapped_array) and mempin (cuda.pinned,
cuda.mapped) use pinmem; device memory stays Numba's own. Use it with
NUMBA_CUDA_MEMORY_MANAGER=pinmem.numba, or
numba.cuda.set_memory_manager(pinmem.numba.PinmemMemoryManager).
"""

import ctypes
import weakref

try:
    from numba.cuda.cudadrv import driver as _driver
except ImportError as e:  # pragma: no cover - depends on the machine
    raise ImportError(f"pinmem.numba needs Numba's CUDA target, which does not import here: {e}") from e

from . import _lib
from ._errors import PinmemMemoryError, check

__all__ = ["PinmemMemoryManager"]

_PORTABLE, _DEVICEMAP, _WRITECOMBINED = 0x1, 0x2, 0x4


def _alloc_host(size, flags):
    p = ctypes.c_void_p()
    check(_lib.load().pm_mem_host_alloc(ctypes.byref(p), size, flags), "pinmem.numba memhostalloc")
    return p.value or 0


def _free_host(pointer):
    check(_lib.load().pm_mem_free_host(pointer), "pinmem.numba free")


def _unregister(pointer):
    check(_lib.load().pm_mem_host_unregister(pointer), "pinmem.numba unpin")


def _host_pointer(pointer):
    """The pointer as Numba's memory objects take it: an int with the NVIDIA
    binding, a c_void_p with Numba's ctypes binding (it reads .value)."""
    return pointer if getattr(_driver, "USE_NV_BINDING", True) else ctypes.c_void_p(pointer)


def _retry_after_flush(manager, allocate):
    """As Numba does: on out-of-memory, flush the deferred frees and try once more."""
    try:
        return allocate()
    except PinmemMemoryError:
        manager.deallocations.clear()
        return allocate()


class PinmemMemoryManager(_driver.NumbaCUDAMemoryManager):
    """Numba's own memory manager with pinmem's host memory."""

    def memhostalloc(self, size, mapped=False, portable=False, wc=False):
        flags = (_DEVICEMAP if mapped else 0) | (_PORTABLE if portable else 0) | \
                (_WRITECOMBINED if wc else 0)
        pointer = _retry_after_flush(self, lambda: _alloc_host(size, flags))
        allocations, deallocations = self.allocations, self.deallocations

        def finalizer():
            if mapped and allocations:
                allocations.pop(pointer, None)
            # through the deferred-free queue, so defer_cleanup() holds it back
            if mapped:
                deallocations.add_item(_free_host, pointer, size)
            else:
                deallocations.add_item(_free_host, pointer)

        ctx = weakref.proxy(self.context)
        if mapped:
            mem = _driver.MappedMemory(ctx, _host_pointer(pointer), size, finalizer=finalizer)
            self.allocations[pointer] = mem
            return mem.own()
        return _driver.PinnedMemory(ctx, _host_pointer(pointer), size, finalizer=finalizer)

    def mempin(self, owner, pointer, size, mapped=False):
        if isinstance(pointer, ctypes.c_void_p):
            pointer = pointer.value or 0
        pointer = int(pointer)
        flags = _DEVICEMAP if mapped else 0

        def register():
            check(_lib.load().pm_mem_host_register(pointer, size, flags), "pinmem.numba mempin")

        _retry_after_flush(self, register)
        allocations = self.allocations

        def finalizer():
            # at once, not deferred: the same memory may be pinned again right away
            if mapped and allocations:
                allocations.pop(pointer, None)
            _unregister(pointer)

        ctx = weakref.proxy(self.context)
        if mapped:
            mem = _driver.MappedMemory(ctx, _host_pointer(pointer), size, owner=owner,
                                       finalizer=finalizer)
            self.allocations[pointer] = mem
            return mem.own()
        return _driver.PinnedMemory(ctx, _host_pointer(pointer), size, owner=owner,
                                    finalizer=finalizer)


# The name NUMBA_CUDA_MEMORY_MANAGER=pinmem.numba looks for.
_numba_memory_manager = PinmemMemoryManager
