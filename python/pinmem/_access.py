"""Whether this process may read, or write, a range of addresses it holds
no object for, asked of the kernel without touching the memory: an int
address given to copy() must fail cleanly, not fault in the copy.

Linux 6.11 and later answer from the process's list of mappings, with each
mapping's permissions (the PROCMAP_QUERY ioctl of /proc/self/maps). Device
memory lies in mappings that permit nothing; there the library says whether
the range is one allocation it or the driver knows, which a copy moves by
DMA. Older kernels only say whether every page is mapped (msync)."""

import ctypes
import os
import threading

from . import _lib

_PROCMAP_QUERY = 0xC0686611  # _IOWR('f', 17, struct procmap_query)
_VMA_READABLE = 0x1
_VMA_WRITABLE = 0x2
_READ_WRITE = _VMA_READABLE | _VMA_WRITABLE
_ENOENT = 2
_MS_ASYNC = 1

# What the kernel answers for a range.
GOOD = "good"
UNMAPPED = "unmapped"
NO_ACCESS = "no access"  # a mapping that permits some access, not the one asked
NOTHING_PERMITTED = "nothing permitted"  # a guard page, or device memory


class _Query(ctypes.Structure):
    """struct procmap_query (include/uapi/linux/fs.h); names and build ids
    are not asked for (their sizes stay 0)."""
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "size", "query_flags", "query_addr", "vma_start", "vma_end", "vma_flags",
        "vma_page_size", "vma_offset", "inode")] + \
        [(name, ctypes.c_uint32) for name in ("dev_major", "dev_minor", "vma_name_size",
                                             "build_id_size")] + \
        [(name, ctypes.c_uint64) for name in ("vma_name_addr", "build_id_addr")]


_libc = ctypes.CDLL(None, use_errno=True)
_ioctl = _libc.ioctl
_ioctl.restype = ctypes.c_int
_ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
_msync = _libc.msync
_msync.restype = ctypes.c_int
_msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

# /proc/self/maps, opened on first use: None not yet, -1 where the kernel
# cannot answer (then msync is asked). A child of fork opens its own. One
# query structure, which the kernel fills in, serves every call under the
# lock, so no call allocates one.
_maps = None
_lock = threading.Lock()
_query = _Query(size=ctypes.sizeof(_Query))
_query_ref = ctypes.byref(_query)


def _forget_maps():
    global _maps
    if _maps is not None and _maps >= 0:
        os.close(_maps)
    _maps = None


os.register_at_fork(after_in_child=_forget_maps)


def _open_maps():
    global _maps
    with _lock:
        if _maps is None:
            try:
                fd = os.open("/proc/self/maps", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                fd = -1
            if fd >= 0:
                _query.query_addr = ctypes.addressof(_query)
                if _ioctl(fd, _PROCMAP_QUERY, _query_ref) != 0:
                    os.close(fd)  # no PROCMAP_QUERY here
                    fd = -1
            _maps = fd
    return _maps


def query(start, end, write, found=None):
    """GOOD, UNMAPPED, NO_ACCESS or NOTHING_PERMITTED for [start, end),
    start a page's; with found, a list, each mapping found good is appended
    as (lo, hi)."""
    fd = _maps if _maps is not None else _open_maps()
    if fd >= 0:
        want = _VMA_WRITABLE if write else _VMA_READABLE
        q = _query
        at = start
        with _lock:
            while at < end:
                q.query_addr = at  # query_flags 0: the mapping that covers it, or ENOENT
                if _ioctl(fd, _PROCMAP_QUERY, _query_ref) != 0:
                    if ctypes.get_errno() == _ENOENT:
                        return UNMAPPED
                    break  # the kernel did not answer after all: msync below
                if not q.vma_flags & want:
                    return NO_ACCESS if q.vma_flags & _READ_WRITE else NOTHING_PERMITTED
                at = q.vma_end
                if found is not None:
                    found.append((q.vma_start, at))
            else:
                return GOOD
    # msync(MS_ASYNC) flushes nothing on Linux and answers ENOMEM when any
    # page of the range is unmapped.
    return GOOD if _msync(start, end - start, _MS_ASYNC) == 0 else UNMAPPED


# Each thread's out-parameters for the library's address range, made once:
# making them on every call cost about a third of the call.
_outs = threading.local()


def _range_outs():
    try:
        return _outs.v
    except AttributeError:
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        _outs.v = (base, size, ctypes.byref(base), ctypes.byref(size))
        return _outs.v


def device_allocation(address, nbytes):
    """(lo, hi) of the allocation that holds all of [address, address +
    nbytes) by the library's and the driver's address ranges, or None. Asked
    only where the mapping permits nothing, where such an allocation is
    device memory. (Memory the program itself made inaccessible after
    pinning or allocating it, such as page-locked host memory or the posix
    backend's simulated device memory, would pass too, as it does inside a
    pinmem object.)"""
    lib = _lib._lib or _lib.load()
    base, size, base_ref, size_ref = _range_outs()
    if lib.pm_mem_get_address_range(base_ref, size_ref, address):
        return None
    lo = base.value
    hi = lo + size.value
    return (lo, hi) if address + nbytes <= hi else None
