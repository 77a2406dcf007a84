"""pinmem.copy: one call for every kind of memory on either side."""

from . import _lib
from ._errors import error
from ._resolve import DEVICE, UNKNOWN, access_problem, handler, handlers
from ._stream import stream_use, wait_for

# The CUDA array interface's stream numbers 1 and 2 are the legacy and the
# per-thread default streams, whose driver handles are those same numbers;
# pinmem's NULL stream is the legacy one.
_LEGACY = 1

_DST = "pinmem.copy: destination"
_SRC = "pinmem.copy: source"


def order_after(theirs, handle):
    """Makes the copy's stream wait for the stream the CUDA array interface named."""
    if theirs is None or isinstance(theirs, bool) or not isinstance(theirs, int):
        return
    ours = _LEGACY if not handle else handle
    if theirs == ours or theirs == 0:
        return
    wait_for(0 if ours == _LEGACY else ours, 0 if theirs == _LEGACY else theirs)


def _size(nbytes, dst_n, src_n):
    """The bytes to copy; dst_n and src_n are None for int addresses."""
    if nbytes is not None:
        if isinstance(nbytes, bool):
            raise TypeError("pinmem.copy: nbytes must be an int, not a bool")
        if not isinstance(nbytes, int):
            try:
                nbytes = nbytes.__index__()
            except AttributeError:
                raise TypeError(f"pinmem.copy: nbytes must be an int, not {type(nbytes).__name__}") from None
        if nbytes < 0:
            raise ValueError(f"pinmem.copy: nbytes must not be negative ({nbytes})")
        if nbytes >= 1 << 64:
            raise ValueError(f"pinmem.copy: {nbytes} bytes is more than any memory holds")
        for n, role in ((dst_n, "destination"), (src_n, "source")):
            if n is not None and nbytes > n:
                raise ValueError(f"pinmem.copy: {nbytes} bytes do not fit the {role}, which has {n}")
        return nbytes
    if dst_n is None and src_n is None:
        raise ValueError("pinmem.copy: both sides are addresses; give nbytes")
    if dst_n is None or src_n is None:
        return src_n if dst_n is None else dst_n
    if dst_n != src_n:
        raise ValueError(f"pinmem.copy: the sizes differ (destination {dst_n} bytes, source "
                         f"{src_n}); give nbytes to copy part of one")
    return dst_n


def _check_access(role, address, n, write):
    problem = access_problem(address, n, write)
    if problem is not None:
        raise ValueError(f"pinmem.copy: the {role} {problem}")


def copy(dst, src, nbytes=None, *, stream=None):
    """Copies nbytes (default: all of both sides, which must be equal) from
    src to dst. Either side may be a torch tensor (CPU or CUDA), a CuPy
    array, a numpy array, a pinmem.Buffer, DeviceBuffer or Registration, any
    object with __cuda_array_interface__, __array_interface__, DLPack or the
    buffer protocol, or an int address. Only contiguous memory is taken.

    stream None: synchronous (done when the call returns, ordered after the
    legacy default stream's work). Otherwise (a torch, CuPy or cuda.core
    stream, a pinmem.Stream or an int handle) the copy is ordered on that
    stream, with pm_memcpy_async's semantics: a pageable source may be
    reused when the call returns; a pageable destination holds the bytes
    when it returns; page-locked and device memory are copied in stream
    order. On a stream that is capturing a CUDA graph, the host side must be
    page-locked (pinmem's memory, or pinned by the driver, as a pinned torch
    tensor is): a pageable one raises PinmemError
    (PM_ERROR_STREAM_CAPTURE_UNSUPPORTED) before anything is captured, as
    PyTorch raises for a pageable tensor. Returns dst.
    """
    # Every call pays for what follows, so it reads each side once, as a
    # tuple, and asks the system only about int addresses it cannot vouch for.
    handle, let_go = (None, None) if stream is None else stream_use(stream, "pinmem.copy: stream")
    try:
        d_addr, d_n, d_where, d_stream, d_release = \
            (handlers.get(type(dst)) or handler(dst))(dst, True, _DST, handle)
    except BaseException:
        if let_go is not None:
            let_go()
        raise
    try:
        s_addr, s_n, s_where, s_stream, s_release = \
            (handlers.get(type(src)) or handler(src))(src, False, _SRC, handle)
        try:
            if nbytes is None and d_n == s_n and d_n is not None:
                n = d_n
            elif (type(nbytes) is int and 0 <= nbytes < 1 << 64 and (d_n is None or nbytes <= d_n)
                  and (s_n is None or nbytes <= s_n)):
                n = nbytes
            else:
                n = _size(nbytes, d_n, s_n)
            if n:
                if d_where is UNKNOWN and d_addr:
                    _check_access("destination", d_addr, n, True)
                if s_where is UNKNOWN and s_addr:
                    _check_access("source", s_addr, n, False)
                lib = _lib._lib or _lib.load()
                if d_stream is not None and d_where is DEVICE:
                    order_after(d_stream, handle)
                if s_stream is not None and s_where is DEVICE:
                    order_after(s_stream, handle)
                if handle is None:
                    rc = lib.pm_memcpy(d_addr, s_addr, n)
                else:
                    rc = lib.pm_memcpy_async(d_addr, s_addr, n, handle or None)
                if rc:
                    raise error(rc, "pinmem.copy")
        finally:
            if s_release is not None:
                s_release()
    finally:
        if d_release is not None:
            d_release()
        if let_go is not None:
            let_go()
    return dst
