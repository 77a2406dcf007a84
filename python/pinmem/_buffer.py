"""pinmem.Buffer: page-locked host memory with the buffer protocol,
__array_interface__ and DLPack; pinmem.DeviceBuffer: device memory."""

import ctypes
import operator
import sys
import threading
from collections import OrderedDict

from . import _dlpack, _lib
from ._closing import Closing, free_in_forked_child
from ._errors import check
from ._resolve import DEVICE, HOST, disown, own

# Python 3.12 lets a class export its memory itself (__buffer__), so exports
# are counted and close() refuses while any is alive; before 3.12 a Buffer is
# a ctypes array of its size, whose exports pinmem cannot see.
_NATIVE_BUFFER = sys.version_info >= (3, 12)

_api = ctypes.pythonapi
_api.PyMemoryView_FromMemory.restype = ctypes.py_object
_api.PyMemoryView_FromMemory.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int]
_PyBUF_READ, _PyBUF_WRITE = 0x100, 0x200

# Re-entrant: a garbage collection while a thread holds it may close a
# DeviceBuffer on that thread.
_close_lock = free_in_forked_child(threading.RLock())


def _raw_view(address, nbytes):
    """A writable 'B' memoryview over [address, address + nbytes) that owns nothing."""
    if nbytes == 0:
        return memoryview(bytearray())
    return _api.PyMemoryView_FromMemory(address, nbytes, _PyBUF_WRITE)


class Buffer(Closing):
    """Page-locked host memory from pinmem (made by :func:`pinmem.empty` or
    :meth:`pinmem.Pool.alloc`).

    ``memoryview(b)``, ``numpy.asarray(b)`` and ``torch.frombuffer(b,
    dtype=torch.uint8)`` share its memory; so do ``b.numpy(dtype, shape)``,
    ``b.torch(dtype, shape)`` and DLPack consumers (a CPU tensor by default;
    ``b.dlpack_view(device="cuda_host")`` offers it as pinned host memory).
    ``close()`` (or leaving a ``with`` block) gives the memory back now;
    otherwise it goes back when the buffer is garbage collected. On Python
    3.12 and later, close() raises BufferError while a memoryview, array,
    tensor or capsule made from the buffer is still alive; on older Pythons
    pinmem cannot see those, and they must not be used after close(), nor
    may memoryview(), numpy.asarray() or bytes() be taken of a closed buffer
    there (Python's buffer protocol reaches the freed memory without asking
    pinmem; pinmem's own methods raise).
    """

    def __init__(self, *args, **kwargs):
        raise TypeError("pinmem.Buffer is made by pinmem.empty() or Pool.alloc()")

    # ---------------------------------------------------------------- state

    @property
    def ptr(self):
        """The address of the first byte (an int)."""
        if self._ptr is None:
            raise ValueError("the buffer is closed")
        return self._ptr

    @property
    def nbytes(self):
        return self._nbytes

    @property
    def closed(self):
        return self._ptr is None

    @property
    def pool(self):
        """The Pool the memory came from, or None."""
        return self._pool

    @property
    def flags(self):
        return self._flags

    def __len__(self):
        return self._nbytes

    def __repr__(self):
        where = f"from {self._pool!r}" if self._pool is not None else "host allocation"
        if self._ptr is None:
            return f"<pinmem.Buffer closed, {self._nbytes} bytes, {where}>"
        return f"<pinmem.Buffer {self._nbytes} bytes at {self._ptr:#x}, {where}>"

    def close(self):
        """Gives the memory back now (a second close does nothing)."""
        if self._exports:
            _dlpack.collect()  # DLPack exports their consumers are done with
        with _close_lock:
            if self._ptr is None:
                return
            if self._exports:
                raise BufferError(
                    f"cannot close the buffer: {self._exports} memoryview(s), array(s), "
                    f"tensor(s) or capsule(s) made from it, or copies running in other "
                    f"threads, are still alive")
            ptr, self._ptr = self._ptr, None
            disown(ptr)
        _free(ptr, self._pool)

    def __del__(self):
        try:
            ptr, self._ptr = self._ptr, None
            if ptr is not None:
                disown(ptr)
                _free(ptr, self._pool)
        except Exception:
            pass

    def _copy_side(self, writable, what, consumer_stream=None):
        # A copy counts as an export while it runs: close() from another
        # thread must not free the memory under it.
        with _close_lock:
            ptr = self._ptr
            if ptr is None:
                raise ValueError(f"{what}: the buffer is closed")
            self._exports += 1
        return (ptr, self._nbytes, HOST, None, self._copy_done)

    def _copy_done(self):
        with _close_lock:
            self._exports -= 1

    # ------------------------------------------------------- sharing memory

    def _view(self):
        return _raw_view(self.ptr, self._nbytes)

    def __getitem__(self, index):
        if isinstance(index, slice):
            self.ptr  # closed buffers raise here
            # A slice is a view that must hold the buffer (and, from 3.12,
            # count as an export): the raw view holds nothing.
            return memoryview(self).cast("B")[index]
        index = operator.index(index)  # before the hold: __index__ may close the buffer
        ptr, nbytes, _, _, done = self._copy_side(False, "pinmem.Buffer[]")
        try:
            return _raw_view(ptr, nbytes)[index]
        finally:
            done()

    def __setitem__(self, index, value):
        # Held while it writes: a close from another thread waits; an index
        # or value whose conversion closes the buffer finds it closed.
        if not isinstance(index, slice):
            index = operator.index(index)
        ptr, nbytes, _, _, done = self._copy_side(True, "pinmem.Buffer[]")
        try:
            _raw_view(ptr, nbytes)[index] = value
        finally:
            done()

    if _NATIVE_BUFFER:

        def __buffer__(self, flags):
            with _close_lock:
                view = self._view()
                self._exports += 1
            return view

        def __release_buffer__(self, view):
            with _close_lock:
                self._exports -= 1

    @property
    def __array_interface__(self):
        return {"shape": (self._nbytes,), "typestr": "|u1", "data": (self.ptr, False),
                "strides": None, "version": 3}

    def numpy(self, dtype="uint8", shape=None):
        """A numpy array over the buffer (no copy): dtype elements, 1-D over
        the whole buffer unless shape is given."""
        import numpy

        dtype = numpy.dtype(dtype)
        count = self._count(dtype.itemsize, shape)
        if count == 0:
            return numpy.empty(shape if shape is not None else 0, dtype=dtype)
        arr = numpy.frombuffer(self, dtype=dtype, count=count)
        return arr.reshape(shape) if shape is not None else arr

    def torch(self, dtype=None, shape=None):
        """A CPU torch tensor over the buffer (no copy): dtype elements
        (default torch.uint8), 1-D over the whole buffer unless shape is given."""
        import torch

        dtype = torch.uint8 if dtype is None else dtype
        itemsize = torch.empty((), dtype=dtype).element_size()
        count = self._count(itemsize, shape)
        if count == 0:
            t = torch.empty(0, dtype=dtype)
        else:
            source = memoryview(self) if _NATIVE_BUFFER else self
            t = torch.frombuffer(source, dtype=dtype, count=count)
        return t.view(shape) if shape is not None else t

    def _count(self, itemsize, shape):
        self.ptr  # closed buffers raise here
        if itemsize == 0:
            raise ValueError("a dtype of 0-byte elements cannot view memory")
        if shape is None:
            if self._nbytes % itemsize:
                raise ValueError(f"{self._nbytes} bytes are not a whole number of {itemsize}-byte "
                                 f"elements; give a shape")
            return self._nbytes // itemsize
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        count = 1
        for s in shape:
            try:
                size = operator.index(s)
            except TypeError:
                size = -1
            if isinstance(s, bool) or size < 0:
                raise ValueError(f"shape {shape} is not a tuple of sizes")
            count *= size
        if count * itemsize > self._nbytes:
            raise ValueError(f"shape {shape} of {itemsize}-byte elements needs {count * itemsize} "
                             f"bytes; the buffer has {self._nbytes}")
        return count

    def __dlpack_device__(self):
        return (_dlpack.KDL_CPU, 0)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        return self.dlpack_view().__dlpack__(stream=stream, max_version=max_version,
                                             dl_device=dl_device, copy=copy)

    def dlpack_view(self, dtype="uint8", shape=None, *, device="cpu"):
        """An object with __dlpack__ / __dlpack_device__ over the buffer, of
        dtype and shape (1-D over the whole buffer by default), offered as
        device "cpu" (kDLCPU) or "cuda_host" (kDLCUDAHost: page-locked memory
        that CUDA frameworks may map)."""
        if device not in _dlpack.DEVICE_NAMES:
            raise ValueError(f"device must be one of {', '.join(_dlpack.DEVICE_NAMES)}, not {device!r}")
        code = _dlpack.dtype_code(dtype)
        count = self._count(code[1] // 8, shape)
        if shape is None:
            shape = (count,)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return DLPackView(self, shape, code, (_dlpack.DEVICE_NAMES[device], 0))


class DLPackView:
    """A typed DLPack export of a Buffer (see Buffer.dlpack_view)."""

    def __init__(self, buffer, shape, code, device):
        self._buffer, self._shape, self._code, self._device = buffer, shape, code, device

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("pinmem exports its memory without copying (copy=True asked)")
        device = self._device
        if dl_device is not None:
            dl_device = tuple(dl_device)
            if dl_device[0] not in (_dlpack.KDL_CPU, _dlpack.KDL_CUDA_HOST):
                raise BufferError(f"pinmem host memory cannot be exported to device {dl_device}")
            device = dl_device
        keep = memoryview(self._buffer) if _NATIVE_BUFFER else self._buffer
        return _dlpack.export(self._buffer.ptr, self._shape, self._code, device, keep)


def _free(ptr, pool):
    if ptr == 0:
        return
    lib = _lib.load()
    if pool is not None:
        check(lib.pm_mem_free(ptr), "Buffer.close")
    else:
        check(lib.pm_mem_free_host(ptr), "Buffer.close")


_sized_types = OrderedDict()
_sized_lock = threading.Lock()
_SIZED_CACHE = 512


def _sized_type(nbytes):
    """Before 3.12: the Buffer subclass that is a ctypes array of nbytes
    bytes (made through the metaclass, which keeps no cache of its own)."""
    with _sized_lock:
        cls = _sized_types.get(nbytes)
        if cls is not None:
            _sized_types.move_to_end(nbytes)
            return cls
    cls = type(ctypes.Array)("Buffer", (Buffer, ctypes.Array),
                             {"_type_": ctypes.c_ubyte, "_length_": nbytes,
                              "__module__": __name__, "__qualname__": "Buffer"})
    with _sized_lock:
        _sized_types[nbytes] = cls
        while len(_sized_types) > _SIZED_CACHE:
            _sized_types.popitem(last=False)
    return cls


def make(ptr, nbytes, pool, flags):
    if _NATIVE_BUFFER:
        b = object.__new__(Buffer)
    else:
        b = _sized_type(nbytes).from_address(ptr)
    b._ptr = ptr
    b._nbytes = nbytes
    b._pool = pool
    b._flags = flags
    b._exports = 0
    own(ptr, nbytes)
    return b


def _check_size(nbytes, what):
    if isinstance(nbytes, bool):
        raise TypeError(f"{what}: nbytes must be an int, not a bool")
    if not isinstance(nbytes, int):
        try:
            nbytes = nbytes.__index__()
        except AttributeError:
            raise TypeError(f"{what}: nbytes must be an int, not {type(nbytes).__name__}") from None
    if nbytes < 0:
        raise ValueError(f"{what}: nbytes must not be negative ({nbytes})")
    if nbytes >= 1 << 63:
        raise ValueError(f"{what}: {nbytes} bytes is more than any allocation can hold")
    return nbytes


ALLOC_FLAGS = 0x7  # PORTABLE | DEVICEMAP | WRITECOMBINED


def empty(nbytes, *, flags=0, pool=None):
    """nbytes of page-locked host memory (uninitialised): cuMemHostAlloc with
    flags (pinmem.HOSTALLOC_*), or from pool (a pinmem.Pool) when given."""
    nbytes = _check_size(nbytes, "pinmem.empty")
    if isinstance(flags, bool) or not isinstance(flags, int):
        raise TypeError(f"pinmem.empty: flags must be an int, not {type(flags).__name__}")
    if pool is not None:
        from ._pool import Pool

        if not isinstance(pool, Pool):
            raise TypeError(f"pinmem.empty: pool must be a pinmem.Pool, not {type(pool).__name__}")
        if flags:
            raise ValueError("pinmem.empty: flags cannot be given with a pool (pools take none)")
        return pool.alloc(nbytes)
    if flags & ~ALLOC_FLAGS:
        raise ValueError(f"pinmem.empty: flags {flags:#x} has bits outside HOSTALLOC_PORTABLE, "
                         f"HOSTALLOC_DEVICEMAP and HOSTALLOC_WRITECOMBINED")
    lib = _lib.load()
    p = ctypes.c_void_p()
    check(lib.pm_mem_host_alloc(ctypes.byref(p), nbytes, flags), "pinmem.empty")
    return make(p.value or 0, nbytes, None, flags)


class DeviceBuffer(Closing):
    """Device memory (pm_device_alloc): cuMemAlloc on the cuda backend;
    on the posix backend ordinary memory that pinmem treats as device
    memory. Made by :func:`pinmem.device_empty`."""

    def __init__(self, nbytes):
        nbytes = _check_size(nbytes, "pinmem.device_empty")
        lib = _lib.load()
        d = ctypes.c_uint64()
        check(lib.pm_device_alloc(ctypes.byref(d), nbytes), "pinmem.device_empty")
        self._ptr = d.value
        self._nbytes = nbytes
        self._copies = 0
        own(d.value, nbytes, device=True)

    @property
    def ptr(self):
        if self._ptr is None:
            raise ValueError("the device buffer is closed")
        return self._ptr

    @property
    def nbytes(self):
        return self._nbytes

    @property
    def closed(self):
        return self._ptr is None

    def __len__(self):
        return self._nbytes

    @property
    def __cuda_array_interface__(self):
        if _lib.load().pm_backend_name() != b"cuda":
            raise AttributeError("posix device memory is not CUDA memory")
        return {"shape": (self._nbytes,), "typestr": "|u1", "data": (self.ptr, False),
                "strides": None, "version": 3, "stream": None}

    def _copy_side(self, writable, what, consumer_stream=None):
        with _close_lock:
            ptr = self._ptr
            if ptr is None:
                raise ValueError(f"{what}: the device buffer is closed")
            self._copies += 1
        return (ptr, self._nbytes, DEVICE, None, self._copy_done)

    def _copy_done(self):
        with _close_lock:
            self._copies -= 1

    def close(self):
        with _close_lock:
            if self._ptr is not None and self._copies:
                raise BufferError("cannot close the device buffer: copies running in other "
                                  "threads still use it")
            ptr, self._ptr = self._ptr, None
            if ptr is not None:
                disown(ptr)
        if ptr is not None:
            check(_lib.load().pm_device_free(ptr), "DeviceBuffer.close")

    def __repr__(self):
        if self._ptr is None:
            return f"<pinmem.DeviceBuffer closed, {self._nbytes} bytes>"
        return f"<pinmem.DeviceBuffer {self._nbytes} bytes at {self._ptr:#x}>"


def device_empty(nbytes):
    """nbytes of device memory (see DeviceBuffer)."""
    return DeviceBuffer(nbytes)
