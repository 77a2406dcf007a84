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
from ._stream import stream_use

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
        what = "PinmemMemoryResource.allocate"
        lib = _lib.load()
        p = ctypes.c_void_p()
        handle, let_go = (None, None) if stream is None else stream_use(stream, f"{what}: stream")
        try:
            if size:
                # held: a close() from another thread meanwhile is refused
                with self._pool._held(what) as pool:
                    if handle is None:
                        check(lib.pm_mem_alloc_from_pool(ctypes.byref(p), size, pool), what)
                    else:
                        check(lib.pm_mem_alloc_from_pool_async(ctypes.byref(p), size, pool,
                                                               handle or None), what)
        finally:
            if let_go is not None:
                let_go()
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
        what = "PinmemMemoryResource.deallocate"
        lib = _lib.load()
        handle, let_go = (None, None) if stream is None else stream_use(stream, f"{what}: stream")
        try:
            if handle is None:
                check(lib.pm_mem_free(ptr), what)
            else:
                check(lib.pm_mem_free_async(ptr, handle or None), what)
        finally:
            if let_go is not None:
                let_go()

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
