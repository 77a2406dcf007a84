"""pinmem.copy: one call for every kind of memory on either side."""

from . import _lib
from ._errors import check
from ._resolve import DEVICE, UNKNOWN, mapped, resolve
from ._stream import stream_handle, wait_for

# The CUDA array interface's stream numbers 1 and 2 are the legacy and the
# per-thread default streams, whose driver handles are those same numbers;
# pinmem's NULL stream is the legacy one.
_LEGACY = 1


def _order_after(side, handle):
    """Makes the copy's stream wait for the stream the CUDA array interface named."""
    theirs = side.stream
    if theirs is None or isinstance(theirs, bool) or not isinstance(theirs, int):
        return
    ours = _LEGACY if not handle else handle
    if theirs == ours or theirs == 0:
        return
    wait_for(0 if ours == _LEGACY else ours, 0 if theirs == _LEGACY else theirs)


def _size(nbytes, dst, src):
    if nbytes is None and dst.nbytes == src.nbytes and dst.nbytes is not None:
        return dst.nbytes
    if nbytes is not None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, int):
            try:
                nbytes = nbytes.__index__()
            except AttributeError:
                raise TypeError(f"pinmem.copy: nbytes must be an int, not {type(nbytes).__name__}") from None
        if nbytes < 0:
            raise ValueError(f"pinmem.copy: nbytes must not be negative ({nbytes})")
        for side, role in ((dst, "destination"), (src, "source")):
            if side.nbytes is not None and nbytes > side.nbytes:
                raise ValueError(f"pinmem.copy: {nbytes} bytes do not fit the {role}, which has "
                                 f"{side.nbytes}")
        return nbytes
    if dst.nbytes is None and src.nbytes is None:
        raise ValueError("pinmem.copy: both sides are addresses; give nbytes")
    if dst.nbytes is None or src.nbytes is None:
        return src.nbytes if dst.nbytes is None else dst.nbytes
    if dst.nbytes != src.nbytes:
        raise ValueError(f"pinmem.copy: the sizes differ (destination {dst.nbytes} bytes, source "
                         f"{src.nbytes}); give nbytes to copy part of one")
    return dst.nbytes


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
    handle = stream_handle(stream, "pinmem.copy: stream")
    d = resolve(dst, writable=True, what="pinmem.copy: destination", consumer_stream=handle)
    try:
        s = resolve(src, writable=False, what="pinmem.copy: source", consumer_stream=handle)
        try:
            n = _size(nbytes, d, s)
            for side, role in ((d, "destination"), (s, "source")):
                if n and side.where == UNKNOWN and side.address and not mapped(side.address, n):
                    raise ValueError(f"pinmem.copy: the {role} address {side.address:#x} (+{n} "
                                     f"bytes) is not mapped in this process")
            if n:
                lib = _lib._lib or _lib.load()
                if d.stream is not None and d.where == DEVICE:
                    _order_after(d, handle)
                if s.stream is not None and s.where == DEVICE:
                    _order_after(s, handle)
                if handle is None:
                    check(lib.pm_memcpy(d.address, s.address, n), "pinmem.copy")
                else:
                    check(lib.pm_memcpy_async(d.address, s.address, n, handle or None), "pinmem.copy")
        finally:
            s.release()
    finally:
        d.release()
    return dst
