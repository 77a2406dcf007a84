"""pinmem.cupy: CuPy's pinned-memory allocator served by pinmem pools.

install() makes cupy.cuda.alloc_pinned_memory (cupyx.empty_pinned,
asynchronous copies to the host, ...) take page-locked memory from a pinmem
pool; uninstall() puts CuPy's own allocator back.
"""

try:
    import cupy as _cupy
except ImportError as e:  # pragma: no cover - depends on the machine
    raise ImportError(f"pinmem.cupy needs CuPy, which does not import here: {e}") from e

from ._pool import Pool

__all__ = ["install", "uninstall", "allocator"]


class PinnedMemory:
    """What CuPy's PinnedMemoryPointer holds: ptr and size, freed back to the
    pool when CuPy lets go of it."""

    __slots__ = ("buffer", "ptr", "size")

    def __init__(self, buffer):
        self.buffer = buffer
        self.ptr = buffer.ptr
        self.size = buffer.nbytes

    def __int__(self):
        return self.ptr


def allocator(pool=None):
    """A function for cupy.cuda.set_pinned_memory_allocator drawing from pool
    (default: pinmem's process-wide pool)."""
    pool = Pool.default() if pool is None else pool
    if not isinstance(pool, Pool):
        raise TypeError(f"pinmem.cupy: pool must be a pinmem.Pool, not {type(pool).__name__}")

    def alloc_pinned(size):
        return _cupy.cuda.PinnedMemoryPointer(PinnedMemory(pool.alloc(size)), 0)

    alloc_pinned.pool = pool
    return alloc_pinned


def install(pool=None):
    """Sets CuPy's pinned-memory allocator to pinmem's pool (default: the process-wide one)."""
    fn = allocator(pool)
    _cupy.cuda.set_pinned_memory_allocator(fn)
    return fn


def uninstall():
    """Puts CuPy's own pinned-memory allocator back: its default pinned pool
    (None would select CuPy's unpooled allocation instead)."""
    _cupy.cuda.set_pinned_memory_allocator(_cupy.get_default_pinned_memory_pool().malloc)
