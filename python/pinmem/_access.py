"""Whether a copy may read, or write, a range of addresses given as an int:
an int address given to copy() must fail cleanly, not fault in the
copy. The library asks the kernel without touching the memory
(pm_mem_check_access): readable or writable mappings as the copy needs, or
one device allocation. Before Linux 6.11 the library reads the text of
/proc/self/maps for it, which takes longer the more mappings lie below the
address."""

import ctypes
import threading

from . import _errors, _lib

_READ = 0x1  # PM_ACCESS_READ
_WRITE = 0x2  # PM_ACCESS_WRITE
_INVALID_VALUE = 1
_PREFIX = "pm_mem_check_access: "

# Each thread's out-parameters for the span found good, made once: making
# them on every call cost about a third of the call.
_outs = threading.local()


def _span_outs():
    try:
        return _outs.v
    except AttributeError:
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        _outs.v = (base, size, ctypes.byref(base), ctypes.byref(size))
        return _outs.v


def problem(address, nbytes, write, spans=None, what="pinmem.copy"):
    """None when a copy may read (or, with write, write) [address, address +
    nbytes); else why not, as words that follow "the source" or "the
    destination" in an error ("address 0x... (+n bytes) is not mapped in
    this process"). With spans, a list, the range found good (its one
    mapping or allocation, else the range itself) is appended as (lo, hi).
    Any other failure (a forked child's, for one) raises PinmemError."""
    lib = _lib._lib or _lib.load()
    access = _WRITE if write else _READ
    if spans is None:
        rc = lib.pm_mem_check_access(address, nbytes, access, None, None)
    else:
        base, size, base_ref, size_ref = _span_outs()
        rc = lib.pm_mem_check_access(address, nbytes, access, base_ref, size_ref)
        if not rc:
            spans.append((base.value, base.value + size.value))
    if not rc:
        return None
    if rc != _INVALID_VALUE:
        raise _errors.error(rc, what)
    detail = (lib.pm_last_error_detail() or b"").decode(errors="replace")
    return detail[len(_PREFIX):] if detail.startswith(_PREFIX) else detail
