"""pinmem.Pool: host memory pools (cuMemPoolCreate with a host location)."""

import ctypes
import json

from . import _lib
from ._closing import Handled
from ._errors import check

_UNSET = object()


def _stats_json(pool_handle, what):
    lib = _lib.load()
    buf = ctypes.create_string_buffer(1024)
    needed = ctypes.c_size_t()
    r = lib.pm_mem_pool_stats_json(pool_handle, buf, len(buf), ctypes.byref(needed))
    if r and needed.value >= len(buf):
        buf = ctypes.create_string_buffer(needed.value + 1)
        r = lib.pm_mem_pool_stats_json(pool_handle, buf, len(buf), ctypes.byref(needed))
    check(r, what)
    return json.loads(buf.value.decode())


class Pool(Handled):
    """A pool of page-locked host memory.

    location: "host", or ("numa", node) for memory on one NUMA node.
    max_size: the most bytes the pool may reserve (0: no limit).
    release_threshold: bytes the pool keeps when streams synchronize (None:
    pinmem's default, keep everything; 0: the driver's default, give back
    all unused memory).
    """

    _noun = "pool"

    def __init__(self, location="host", *, max_size=0, release_threshold=None):
        lib = _lib.load()
        props = _lib.PoolProps()
        if location == "host":
            props.location.type = _lib.PM_MEM_LOCATION_TYPE_HOST
        elif (isinstance(location, tuple) and len(location) == 2 and location[0] == "numa"
              and isinstance(location[1], int) and not isinstance(location[1], bool)
              and -(1 << 31) <= location[1] < 1 << 31):
            props.location.type = _lib.PM_MEM_LOCATION_TYPE_HOST_NUMA
            props.location.id = location[1]
        else:
            raise ValueError(f'pinmem.Pool: location must be "host" or ("numa", node), '
                             f'not {location!r}')
        if (isinstance(max_size, bool) or not isinstance(max_size, int)
                or not 0 <= max_size < 1 << 64):
            raise ValueError(f"pinmem.Pool: max_size must be a size in bytes, not {max_size!r}")
        props.max_size = max_size
        handle = ctypes.c_void_p()
        check(lib.pm_mem_pool_create(ctypes.byref(handle), ctypes.byref(props)), "pinmem.Pool")
        self._handle = handle.value
        self._owned = True
        self._location = location
        if release_threshold is not None:
            try:
                self.release_threshold = release_threshold
            except BaseException:
                self.close()
                raise

    @classmethod
    def default(cls):
        """The process-wide pool of location "host" (never destroyed)."""
        lib = _lib.load()
        handle = ctypes.c_void_p()
        check(lib.pm_mem_get_default_pool(ctypes.byref(handle)), "Pool.default")
        pool = object.__new__(cls)
        pool._handle = handle.value
        pool._owned = False
        pool._location = "host"
        return pool

    @property
    def handle(self):
        """The pm_mem_pool_t as an int."""
        if self._handle is None:
            raise ValueError("the pool is closed")
        return self._handle

    @property
    def closed(self):
        return self._handle is None

    def alloc(self, nbytes):
        """nbytes from the pool, as a pinmem.Buffer (freed back to the pool on close)."""
        from ._buffer import _check_size, make

        nbytes = _check_size(nbytes, "Pool.alloc")
        p = ctypes.c_void_p()
        with self._held("Pool.alloc") as handle:
            check(_lib.load().pm_mem_alloc_from_pool(ctypes.byref(p), nbytes, handle), "Pool.alloc")
        return make(p.value or 0, nbytes, self, 0)

    def trim(self, keep=0):
        """Gives back unused memory until at most keep bytes stay reserved,
        never what is in use (cuMemPoolTrimTo)."""
        if isinstance(keep, bool) or not isinstance(keep, int) or not 0 <= keep < 1 << 64:
            raise ValueError(f"Pool.trim: keep must be a size in bytes, not {keep!r}")
        with self._held("Pool.trim") as handle:
            check(_lib.load().pm_mem_pool_trim_to(handle, keep), "Pool.trim")

    @property
    def release_threshold(self):
        v = ctypes.c_uint64()
        with self._held("Pool.release_threshold") as handle:
            check(_lib.load().pm_mem_pool_get_attribute(handle, _lib.PM_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                                        ctypes.byref(v)), "Pool.release_threshold")
        return v.value

    @release_threshold.setter
    def release_threshold(self, value):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 64:
            raise ValueError(f"release_threshold must be a size in bytes, not {value!r}")
        v = ctypes.c_uint64(value)
        with self._held("Pool.release_threshold") as handle:
            check(_lib.load().pm_mem_pool_set_attribute(handle, _lib.PM_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                                        ctypes.byref(v)), "Pool.release_threshold")

    def stats(self):
        """The pool's statistics (pm_pool_stats) as a dict."""
        with self._held("Pool.stats") as handle:
            return _stats_json(handle, "Pool.stats")

    def close(self):
        """Destroys the pool; buffers still alive keep their memory until they
        are closed. BufferError while a call in another thread uses the pool."""
        handle = self._take_handle()
        if handle is not None and self._owned:
            check(_lib.load().pm_mem_pool_destroy(handle), "Pool.close")

    def __repr__(self):
        state = "closed" if self._handle is None else f"{self._handle:#x}"
        return f"<pinmem.Pool {self._location!r} {state}>"


def stats():
    """The copy engine's counters and all pools' statistics together."""
    lib = _lib.load()
    cs = _lib.CopyStats()
    cs.struct_size = ctypes.sizeof(cs)
    check(lib.pm_copy_get_stats(ctypes.byref(cs)), "pinmem.stats")
    copy = {name: getattr(cs, name) for name, _ in _lib.CopyStats._fields_ if name != "struct_size"}
    return {"copy": copy, "pools": _stats_json(None, "pinmem.stats")}
