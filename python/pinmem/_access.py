"""Whether this process may read, or write, a range of addresses it holds
no object for, asked of the kernel without touching the memory: an int
address given to copy() must fail cleanly, not fault in the copy.

Linux 6.11 and later answer from the process's list of mappings, with each
mapping's permissions (the PROCMAP_QUERY ioctl of /proc/self/maps). Device
memory lies in mappings the process may not touch; there the library says
whether the range is one device allocation, which a copy never touches with
the CPU. Older kernels only say whether every page is mapped (msync)."""

import ctypes
import os
import threading

from . import _lib

_PROCMAP_QUERY = 0xC0686611  # _IOWR('f', 17, struct procmap_query)
_VMA_READABLE = 0x1
_VMA_WRITABLE = 0x2
_ENOENT = 2
_MS_ASYNC = 1

# What the kernel answers for a range.
GOOD = "good"
UNMAPPED = "unmapped"
NO_ACCESS = "no access"


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
# query structure serves every call, under the lock, which also keeps
# kernels whose early per-mapping locking shared state between concurrent
# queries of one file safe.
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
    """GOOD, UNMAPPED or NO_ACCESS for [start, end), start a page's; with
    found, a list, each mapping found good is appended as (lo, hi)."""
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
                    return NO_ACCESS
                at = q.vma_end
                if found is not None:
                    found.append((q.vma_start, at))
            else:
                return GOOD
    # msync(MS_ASYNC) flushes nothing on Linux and answers ENOMEM when any
    # page of the range is unmapped.
    return GOOD if _msync(start, end - start, _MS_ASYNC) == 0 else UNMAPPED


def device_allocation(address, nbytes):
    """(lo, hi) of the device allocation that holds all of [address, address
    + nbytes), or None: memory the driver knows (its address range) that is
    not page-locked host memory (no device pointer for it)."""
    lib = _lib._lib or _lib.load()
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    if lib.pm_mem_get_address_range(ctypes.byref(base), ctypes.byref(size), address):
        return None
    hi = base.value + size.value
    if address + nbytes > hi:
        return None
    if lib.pm_mem_host_get_device_pointer(ctypes.byref(ctypes.c_uint64()), address, 0) == 0:
        return None
    return base.value, hi
