"""pinmem.copy_batch: many copies between addresses in one call."""

import ctypes
import sys
from array import array
from operator import add

from . import _lib
from ._errors import error
from ._resolve import access_problem
from ._stream import stream_use

_WHAT = "pinmem.copy_batch"
_U64 = ctypes.c_uint64
_TOP = 1 << 64
_ARRAY_TYPES = {"<u8": _U64, "|u8": _U64, "<i8": ctypes.c_int64, "|i8": ctypes.c_int64}


def _ints(ctypes_array, code):
    return memoryview(ctypes_array).cast("B").cast(code)


def _bad_item(values, role):
    """The error for the first item of values that is not an int from 0 to
    2**64 - 1."""
    for i, v in enumerate(values):
        if isinstance(v, bool):
            return TypeError(f"{_WHAT}: {role}[{i}] must be an int, not a bool")
        if not hasattr(v, "__index__"):
            return TypeError(f"{_WHAT}: {role}[{i}] must be an int, not {type(v).__name__}")
        if not 0 <= v.__index__() < _TOP:
            return ValueError(f"{_WHAT}: {role}[{i}] is {v}, outside 0 to 2**64 - 1")
    return TypeError(f"{_WHAT}: {role} holds something that is not an int")


def _as_array(values, role):
    """values as a ctypes uint64 array for the call, and the same values as
    a sequence that Python reads quickly.

    An object with __array_interface__ (a numpy array of uint64 or int64,
    one-dimensional and contiguous) is read in place; a sequence of ints is
    copied once, by the array module, which checks each."""
    face = getattr(values, "__array_interface__", None)
    if face is not None:
        shape, strides = face.get("shape", ()), face.get("strides")
        kind = _ARRAY_TYPES.get(face.get("typestr"))
        if kind is None or len(shape) != 1 or strides not in (None, (8,)):
            raise TypeError(f"{_WHAT}: {role} must be a contiguous one-dimensional array of "
                            f"uint64 or int64, not {face.get('typestr')} of shape {shape}")
        n = shape[0]
        if n == 0:
            return (_U64 * 0)(), ()
        address = face["data"][0]
        # ctypes' buffers say "<q"; a plain "q" view is one Python iterates
        if kind is ctypes.c_int64 and min(_ints((kind * n).from_address(address), "q")) < 0:
            raise ValueError(f"{_WHAT}: {role} holds a negative value")
        view = (_U64 * n).from_address(address)
        return view, _ints(view, "Q")
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{_WHAT}: {role} must be a sequence of ints or an array, not "
                        f"{type(values).__name__}")
    items = values if isinstance(values, (list, tuple)) else list(values)
    try:
        packed = array("Q", items)
    except (TypeError, OverflowError):
        raise _bad_item(items, role) from None
    # array() takes bools as 0 and 1; only then is each item looked at
    if (0 in packed or 1 in packed) and any(isinstance(v, bool) for v in items):
        raise _bad_item(items, role)
    return (_U64 * len(packed)).from_buffer(packed) if packed else (_U64 * 0)(), packed


def _span(addresses, sizes):
    """The lowest address and the highest end of the elements, by numpy where
    it is loaded (a Python pass over a thousand ints costs 200 µs); None for
    an end past the top of the address space."""
    np = sys.modules.get("numpy")
    if np is None:
        hi = max(map(add, addresses, sizes))
        return min(addresses), hi if hi <= _TOP else None
    starts = np.frombuffer(addresses, dtype=np.uint64)
    ends = starts + np.frombuffer(sizes, dtype=np.uint64)
    return int(starts.min()), None if (ends < starts).any() else int(ends.max())


def _check_access(addresses, sizes, role, write):
    """Raises ValueError for the first element whose range the copy may not
    touch (_resolve.access_problem): a stray address must fail here, not
    fault in a copy. One look covers the whole batch where its elements lie
    in one mapping or device allocation, and each one found good is kept
    for the elements after it."""
    lo, hi = _span(addresses, sizes)
    good = []
    if hi is not None and access_problem(lo, hi - lo, write, good, _WHAT) is None:
        return
    for i, (a, n) in enumerate(zip(addresses, sizes)):
        if not n:
            continue
        problem = access_problem(a, n, write, good, _WHAT)
        if problem is not None:
            raise ValueError(f"{_WHAT}: element {i}'s {role} {problem}")


def copy_batch(dsts, srcs, sizes, *, stream=None):
    """Copies sizes[i] bytes from srcs[i] to dsts[i] for every i, in one call
    (pm_memcpy_batch_async): the way to move many blocks, such as a KV
    cache's, between host and device memory. Each of dsts, srcs and sizes is
    a sequence of ints or a one-dimensional uint64 (or int64) array of the
    same length; dsts and srcs hold addresses (tensor.data_ptr() plus an
    offset, Buffer.ptr, ...) of host memory of any kind or device memory,
    each element's direction taken from its pointers.

    Each element is copied as pinmem.copy would copy it, and the elements in
    any order among themselves: no destination may overlap another element's
    range. Every element is checked before anything moves, and a bad one
    raises PinmemError naming its index (or ValueError for an address the
    copy may not touch). stream None: done when the call returns.
    Otherwise (as pinmem.copy takes) ordered on that stream: pageable
    sources may be reused when the call returns, and page-locked and device
    memory are copied in stream order. An empty batch does nothing."""
    handle, let_go = (None, None) if stream is None else stream_use(stream, f"{_WHAT}: stream")
    try:
        # Arrays read in place stay alive as this call's arguments.
        dst_array, dst_seq = _as_array(dsts, "dsts")
        src_array, src_seq = _as_array(srcs, "srcs")
        size_array, size_seq = _as_array(sizes, "sizes")
        n = len(size_array)
        if len(dst_array) != n or len(src_array) != n:
            raise ValueError(f"{_WHAT}: dsts, srcs and sizes differ in length "
                             f"({len(dst_array)}, {len(src_array)}, {n})")
        if n == 0:
            return
        _check_access(dst_seq, size_seq, "destination", True)
        _check_access(src_seq, size_seq, "source", False)
        submit(dst_array, src_array, ctypes.cast(size_array, ctypes.POINTER(ctypes.c_size_t)), n,
               handle, _WHAT)
    finally:
        if let_go is not None:
            let_go()


def submit(dsts, srcs, sizes, n, handle, what):
    """pm_memcpy_batch_async over n elements (ctypes pointers or arrays),
    then, where handle is None, a wait for the legacy default stream."""
    lib = _lib._lib or _lib.load()
    rc = lib.pm_memcpy_batch_async(dsts, srcs, sizes, n, handle or None)
    if rc == 0 and handle is None:
        rc = lib.pm_stream_synchronize(None)
    if rc:
        raise error(rc, what)
