"""pinmem.cuda_core: a cuda.core memory resource handing out pinmem's
page-locked host memory (host- and device-accessible)."""

import ctypes

try:
    from cuda.core import Buffer as _Buffer
    from cuda.core import MemoryResource as _MemoryResource
except ImportError as e:  # pragma: no cover - depends on the machine
    raise ImportError(f"pinmem.cuda_core needs cuda.core, which does not import here: {e}") from e

from . import _lib
from ._errors import check
from ._pool import Pool
from ._stream import stream_handle

__all__ = ["PinmemMemoryResource"]


class PinmemMemoryResource(_MemoryResource):
    """Page-locked host memory from a pinmem pool (default: the process-wide
    one). With a stream, allocation and deallocation are stream-ordered
    (pm_mem_alloc_from_pool_async / pm_mem_free_async); without one they
    are immediate."""

    def __init__(self, pool=None):
        super().__init__()
        pool = Pool.default() if pool is None else pool
        if not isinstance(pool, Pool):
            raise TypeError(f"PinmemMemoryResource: pool must be a pinmem.Pool, not {type(pool).__name__}")
        self._pool = pool

    @property
    def pool(self):
        return self._pool

    # cuda.core passes stream by position (Buffer.close, copy_to) or by name.
    def allocate(self, size, stream=None):
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"PinmemMemoryResource.allocate: size must be a size in bytes, not {size!r}")
        lib = _lib.load()
        p = ctypes.c_void_p()
        handle = stream_handle(stream, "PinmemMemoryResource.allocate: stream")
        if size == 0:
            pass
        elif handle is None:
            check(lib.pm_mem_alloc_from_pool(ctypes.byref(p), size, self._pool.handle),
                  "PinmemMemoryResource.allocate")
        else:
            check(lib.pm_mem_alloc_from_pool_async(ctypes.byref(p), size, self._pool.handle,
                                                   handle or None), "PinmemMemoryResource.allocate")
        ptr = p.value or 0
        try:
            return _Buffer.from_handle(ptr, size, mr=self)
        except BaseException:
            self.deallocate(ptr, size, stream)
            raise

    def deallocate(self, ptr, size, stream=None):
        ptr = int(ptr)
        if not ptr:
            return
        lib = _lib.load()
        handle = stream_handle(stream, "PinmemMemoryResource.deallocate: stream")
        if handle is None:
            check(lib.pm_mem_free(ptr), "PinmemMemoryResource.deallocate")
        else:
            check(lib.pm_mem_free_async(ptr, handle or None), "PinmemMemoryResource.deallocate")

    @property
    def is_device_accessible(self):
        return True

    @property
    def is_host_accessible(self):
        return True

    @property
    def is_managed(self):
        return False

    @property
    def device_id(self):
        """-1: host memory is not bound to one GPU (as cuda.core's PinnedMemoryResource)."""
        return -1
