"""pinmem.copy_blocks: whole blocks between two objects by block index."""

import ctypes
import sys
from array import array

from ._batch import submit
from ._copy import order_after
from ._resolve import DEVICE, handler
from ._stream import stream_use

_WHAT = "pinmem.copy_blocks"
_U64P = ctypes.POINTER(ctypes.c_uint64)
_SIZEP = ctypes.POINTER(ctypes.c_size_t)


def _block_bytes(value):
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{_WHAT}: block_bytes must be an int, not {type(value).__name__}")
    value = value.__index__()
    if value <= 0:
        raise ValueError(f"{_WHAT}: block_bytes must be positive ({value})")
    return value


def _side(obj, writable, role, handle, releases):
    """(address, blocks' bytes, where, stream) of one side, its release added
    to releases; an int address, which says nothing of its size, is refused."""
    address, nbytes, where, stream, release = handler(obj)(obj, writable, f"{_WHAT}: {role}",
                                                           handle)
    if release is not None:
        releases.append(release)
    if nbytes is None:
        raise TypeError(f"{_WHAT}: the {role} must be an object that knows its size (a tensor, "
                        f"an array, a pinmem.Buffer...), not {type(obj).__name__}; "
                        f"pinmem.copy_batch takes addresses")
    return address, nbytes, where, stream


def _out_of_range(row, column, value, limit):
    role = ("source", "destination")[column]
    return ValueError(f"{_WHAT}: mapping[{row}] names {role} block {value}, but the {role} "
                      f"holds blocks 0 to {limit - 1}" if limit else
                      f"{_WHAT}: mapping[{row}] names {role} block {value}, but the {role} is "
                      f"smaller than one block")


def _host_mapping(mapping):
    if hasattr(mapping, "__cuda_array_interface__") or getattr(mapping, "is_cuda", False):
        raise TypeError(f"{_WHAT}: mapping must be in host memory (a CPU tensor, an array or a "
                        f"list of pairs), not device memory")
    if isinstance(mapping, (str, bytes)) or not hasattr(mapping, "__len__"):
        raise TypeError(f"{_WHAT}: mapping must be pairs (source block, destination block): "
                        f"an (n, 2) array or tensor of ints or a sequence of pairs, not "
                        f"{type(mapping).__name__}")
    return mapping


# _addresses_numpy's answer for a sequence whose items the Python pass must
# look at: numpy reads bools as 0 and 1, and ints past int64 as objects.
_BY_PYTHON = object()


def _holds_bool(mapping, m):
    """Whether a sequence of pairs read as m holds a bool (looked for only
    where m holds a 0 or a 1)."""
    if m.shape[1:] != (2,) or m.dtype.kind not in "iu" or not ((m == 0) | (m == 1)).any():
        return False
    return any(type(a) is bool or type(b) is bool for a, b in mapping)


def _addresses_numpy(np, mapping, bases, limits, block):
    try:
        m = np.asarray(mapping)
    except (TypeError, ValueError) as e:  # ragged pairs, say
        raise ValueError(f"{_WHAT}: mapping must be pairs (source block, destination block): "
                         f"{e}") from None
    if m.size == 0:
        return None
    if isinstance(mapping, (list, tuple)) and (m.dtype.kind == "O" or _holds_bool(mapping, m)):
        return _BY_PYTHON
    if m.ndim != 2 or m.shape[1] != 2:
        raise ValueError(f"{_WHAT}: mapping must have shape (n, 2), pairs (source block, "
                         f"destination block), not {m.shape}")
    if m.dtype.kind not in "iu":
        raise TypeError(f"{_WHAT}: mapping must hold ints, not {m.dtype}")
    for column in (0, 1):
        indices = m[:, column]
        bad = (indices < 0) | (indices >= limits[column])
        if bad.any():
            row = int(bad.argmax())
            raise _out_of_range(row, column, int(indices[row]), limits[column])
    srcs, dsts = (np.ascontiguousarray(m[:, c], dtype=np.uint64) * np.uint64(block)
                  + np.uint64(bases[c]) for c in (0, 1))
    sizes = np.full(len(m), block, dtype=np.uint64)
    return (dsts, srcs, sizes), (dsts.ctypes.data_as(_U64P), srcs.ctypes.data_as(_U64P),
                                 sizes.ctypes.data_as(_SIZEP))


def _addresses_python(mapping, bases, limits, block):
    if not len(mapping):
        return None
    columns = (array("Q"), array("Q"))
    for row, pair in enumerate(mapping):
        try:
            pair = tuple(pair)
        except TypeError:
            raise TypeError(f"{_WHAT}: mapping[{row}] must be a pair of ints, not "
                            f"{type(pair).__name__}") from None
        if len(pair) != 2:
            raise ValueError(f"{_WHAT}: mapping[{row}] must be a pair (source block, "
                             f"destination block), not {len(pair)} items")
        for column, value in enumerate(pair):
            if isinstance(value, bool) or not hasattr(value, "__index__"):
                raise TypeError(f"{_WHAT}: mapping[{row}] must hold ints, not "
                                f"{type(value).__name__}")
            value = value.__index__()
            if not 0 <= value < limits[column]:
                raise _out_of_range(row, column, value, limits[column])
            columns[column].append(bases[column] + value * block)
    srcs, dsts = columns
    sizes = array("Q", [block]) * len(srcs)
    arrays = tuple((ctypes.c_uint64 * len(a)).from_buffer(a) for a in (dsts, srcs, sizes))
    return (dsts, srcs, sizes), arrays[:2] + (ctypes.cast(arrays[2], _SIZEP),)


def copy_blocks(dst, src, mapping, block_bytes, *, stream=None):
    """Copies whole blocks of block_bytes bytes from src to dst by index: for
    each pair (s, d) of mapping, bytes [s * block_bytes, (s + 1) *
    block_bytes) of src to the same bytes of block d of dst, all in one
    pm_memcpy_batch_async. It is how a paged KV cache moves blocks between
    its device and host copies (vLLM's swap_blocks takes the same pairs).

    dst and src are anything pinmem.copy takes that knows its size (a CPU or
    CUDA tensor, a numpy or CuPy array, a pinmem.Buffer, ...), contiguous;
    either may be host memory of any kind or device memory. mapping is an
    (n, 2) integer array or CPU tensor, or a sequence of pairs. Every index
    is checked against its side's size, and no destination may overlap
    another pair's destination or source (a block named twice raises
    PinmemError naming both pairs), before anything moves. stream as
    pinmem.copy_batch: None waits until the blocks are there; otherwise
    ordered on that stream, pageable sources reusable on return. An empty
    mapping does nothing."""
    block = _block_bytes(block_bytes)
    handle, let_go = (None, None) if stream is None else stream_use(stream, f"{_WHAT}: stream")
    releases = [] if let_go is None else [let_go]
    try:
        mapping = _host_mapping(mapping)
        sides = (_side(src, False, "source", handle, releases),
                 _side(dst, True, "destination", handle, releases))
        bases = tuple(side[0] for side in sides)
        limits = tuple(side[1] // block for side in sides)
        np = sys.modules.get("numpy")
        if np is None and not isinstance(mapping, (list, tuple)):
            try:
                import numpy as np
            except ImportError:
                np = None
        made = (_addresses_numpy(np, mapping, bases, limits, block) if np is not None
                else None)
        if made is _BY_PYTHON or np is None:
            made = _addresses_python(mapping, bases, limits, block)
        if made is None:
            return dst
        keep, (dsts, srcs, sizes) = made
        for _, _, where, theirs in sides:
            if where is DEVICE:
                order_after(theirs, handle)
        submit(dsts, srcs, sizes, len(keep[2]), handle, _WHAT)
    finally:
        for release in releases:
            release()
    return dst
