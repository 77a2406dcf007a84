"""The address and size behind the objects copy() and register() take."""

import ctypes

from . import _dlpack

PyBUF_WRITABLE = 0x0001
PyBUF_FORMAT = 0x0004
PyBUF_ND = 0x0008
PyBUF_STRIDES = 0x0010 | PyBUF_ND


class _Py_buffer(ctypes.Structure):
    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.POINTER(ctypes.c_ssize_t)),
        ("strides", ctypes.POINTER(ctypes.c_ssize_t)),
        ("suboffsets", ctypes.POINTER(ctypes.c_ssize_t)),
        ("internal", ctypes.c_void_p),
    ]


_api = ctypes.pythonapi
_api.PyObject_GetBuffer.restype = ctypes.c_int
_api.PyObject_GetBuffer.argtypes = [ctypes.py_object, ctypes.POINTER(_Py_buffer), ctypes.c_int]
_api.PyBuffer_Release.restype = None
_api.PyBuffer_Release.argtypes = [ctypes.POINTER(_Py_buffer)]
_api.PyBuffer_IsContiguous.restype = ctypes.c_int
_api.PyBuffer_IsContiguous.argtypes = [ctypes.POINTER(_Py_buffer), ctypes.c_char]

HOST = "host"
DEVICE = "device"
UNKNOWN = "unknown"  # an int address: the library tells


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.restype = ctypes.c_int
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_PAGE = __import__("mmap").PAGESIZE


def mapped(address, nbytes):
    """Whether the first and the last page of [address, address + nbytes) are
    mapped in this process (mincore answers ENOMEM for unmapped pages): a
    stray int address then fails cleanly instead of faulting in a copy.
    Device pointers lie in address space the driver reserves, so they pass."""
    vec = ctypes.c_ubyte()
    for at in {address, address + max(nbytes, 1) - 1}:
        page = at - at % _PAGE
        if _libc.mincore(page, _PAGE, ctypes.byref(vec)) != 0:
            return False
    return True


class Side:
    """One side of a copy: where, how many bytes, on which side of the bus
    (as far as the object says), a stream the data is ordered on (the CUDA
    array interface's), and what to release afterwards."""

    __slots__ = ("address", "nbytes", "where", "stream", "_release", "keep")

    def __init__(self, address, nbytes, where, stream=None, release=None, keep=None):
        self.address = address
        self.nbytes = nbytes
        self.where = where
        self.stream = stream
        self._release = release
        self.keep = keep

    def release(self):
        fn, self._release = self._release, None
        if fn is not None:
            fn()


def _name(obj):
    return type(obj).__name__


def _itemsize(typestr, what):
    try:
        return int(typestr[2:])
    except (TypeError, ValueError):
        raise ValueError(f"{what}: cannot read the element size from typestr {typestr!r}") from None


def _compact(shape, strides, itemsize):
    """Whether a layout is C-contiguous (strides in bytes; None: it is)."""
    if strides is None:
        return True
    if len(strides) != len(shape):
        return False
    if any(s == 0 for s in shape):
        return True
    expected = itemsize
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _from_interface(iface, obj, writable, what, where):
    data = iface.get("data")
    if not isinstance(data, tuple) or len(data) != 2:
        return None
    address, readonly = data
    shape = tuple(iface.get("shape", ()))
    itemsize = _itemsize(iface.get("typestr", "|u1"), what)
    if iface.get("mask") is not None:
        raise ValueError(f"{what}: masked arrays cannot be copied")
    if not _compact(shape, iface.get("strides"), itemsize):
        raise ValueError(f"{what}: the {_name(obj)} is not contiguous; copy only takes "
                         f"contiguous memory (make a contiguous copy first)")
    if writable and readonly:
        raise ValueError(f"{what}: the {_name(obj)} is read-only")
    count = 1
    for s in shape:
        count *= s
    stream = iface.get("stream") if where == DEVICE else None
    return Side(int(address or 0) + int(iface.get("offset", 0) or 0), count * itemsize, where,
                stream=stream, keep=obj)


def _from_torch(t, writable, what):
    if getattr(t, "is_sparse", False) or str(getattr(t, "layout", "torch.strided")) != "torch.strided":
        raise ValueError(f"{what}: sparse and other non-strided tensors cannot be copied")
    if not t.is_contiguous():
        raise ValueError(f"{what}: the tensor is not contiguous; call .contiguous() first")
    for bit in ("is_conj", "is_neg"):
        if getattr(t, bit, None) and getattr(t, bit)():
            raise ValueError(f"{what}: the tensor has a lazy {bit[3:]} bit; call .resolve_{bit[3:]}() first")
    where = DEVICE if t.device.type == "cuda" else HOST if t.device.type == "cpu" else None
    if where is None:
        raise ValueError(f"{what}: tensors on {t.device.type} are not supported (cpu or cuda only)")
    return Side(t.data_ptr(), t.numel() * t.element_size(), where, keep=t)


def _from_buffer(obj, writable, what):
    view = _Py_buffer()
    try:
        _api.PyObject_GetBuffer(obj, ctypes.byref(view), PyBUF_STRIDES | (PyBUF_WRITABLE if writable else 0))
    except BufferError as e:
        if writable:
            try:
                _api.PyObject_GetBuffer(obj, ctypes.byref(view), PyBUF_STRIDES)
            except BufferError:
                pass
            else:
                _api.PyBuffer_Release(ctypes.byref(view))
                raise ValueError(f"{what}: the {_name(obj)} is read-only") from None
        raise ValueError(f"{what}: the {_name(obj)} gives no usable buffer: {e}") from None
    if not _api.PyBuffer_IsContiguous(ctypes.byref(view), b"C"):
        _api.PyBuffer_Release(ctypes.byref(view))
        raise ValueError(f"{what}: the {_name(obj)} is not contiguous; copy only takes contiguous "
                         f"memory")

    def release(view=view):
        _api.PyBuffer_Release(ctypes.byref(view))

    return Side(view.buf or 0, view.len, HOST, release=release, keep=obj)


def _from_dlpack(obj, writable, what, consumer_stream):
    try:
        device_type, _ = obj.__dlpack_device__()
    except Exception as e:
        raise TypeError(f"{what}: __dlpack_device__() failed: {e}") from None
    if device_type in (_dlpack.KDL_CUDA, _dlpack.KDL_CUDA_MANAGED):
        # the producer orders its work before our stream (1: the legacy default stream)
        capsule = obj.__dlpack__(stream=consumer_stream or 1)
        where = DEVICE
    elif device_type in (_dlpack.KDL_CPU, _dlpack.KDL_CUDA_HOST):
        capsule = obj.__dlpack__()
        where = HOST
    else:
        raise ValueError(f"{what}: DLPack device type {device_type} is not CPU or CUDA memory")
    imported = _dlpack.import_capsule(capsule, what)
    if not imported.contiguous:
        imported.release()
        raise ValueError(f"{what}: the {_name(obj)} is not contiguous; copy only takes contiguous "
                         f"memory")
    return Side(imported.address, imported.nbytes, where, release=imported.release, keep=obj)


def _by_int(obj, writable, what, consumer_stream):
    if obj < 0 or obj >= 1 << 64:
        raise ValueError(f"{what}: {obj} is not an address")
    return Side(obj, None, UNKNOWN)


def _by_bool(obj, writable, what, consumer_stream):
    raise TypeError(f"{what}: expected memory or an int address, not a bool")


def _by_pinmem(obj, writable, what, consumer_stream):
    return obj._copy_side(writable, what)


def _by_torch(obj, writable, what, consumer_stream):
    return _from_torch(obj, writable, what)


def _by_interface(name, where):
    def handler(obj, writable, what, consumer_stream):
        iface = getattr(obj, name)
        side = _from_interface(iface, obj, writable, what, where) if isinstance(iface, dict) else None
        return side if side is not None else _by_buffer(obj, writable, what, consumer_stream)
    return handler


_by_cuda_interface = _by_interface("__cuda_array_interface__", DEVICE)
_by_array_interface = _by_interface("__array_interface__", HOST)


def _by_numpy(obj, writable, what, consumer_stream):
    # numpy's flags are cheap to read; its __array_interface__ dict is not, so
    # only the address is taken from it.
    flags = obj.flags
    if not flags.c_contiguous:
        raise ValueError(f"{what}: the ndarray is not contiguous; copy only takes contiguous "
                         f"memory (numpy.ascontiguousarray makes a contiguous copy)")
    if writable and not flags.writeable:
        raise ValueError(f"{what}: the ndarray is read-only")
    return Side(obj.__array_interface__["data"][0], obj.nbytes, HOST, keep=obj)


def _by_dlpack(obj, writable, what, consumer_stream):
    return _from_dlpack(obj, writable, what, consumer_stream)


def _by_buffer(obj, writable, what, consumer_stream):
    try:
        memoryview(obj).release()
    except TypeError:
        raise TypeError(
            f"{what}: cannot take the memory of a {_name(obj)}; pass a pinmem.Buffer, a tensor or "
            f"array (torch, CuPy, numpy or anything with __cuda_array_interface__, "
            f"__array_interface__ or DLPack), an object with the buffer protocol, or an int "
            f"address") from None
    return _from_buffer(obj, writable, what)


# How each type's memory is found, learnt from its first object: every
# interface consulted is an attribute of the type, so the choice holds for
# all its objects.
_handlers = {int: _by_int, bool: _by_bool}


def _pick(cls):
    from ._buffer import Buffer, DeviceBuffer
    from ._register import Registration

    if issubclass(cls, bool):
        return _by_bool
    if issubclass(cls, int):
        return _by_int
    if issubclass(cls, (Buffer, DeviceBuffer, Registration)):
        return _by_pinmem
    mod = cls.__module__ or ""
    if (mod == "torch" or mod.startswith("torch.")) and hasattr(cls, "data_ptr") \
            and hasattr(cls, "element_size"):
        return _by_torch
    if mod.split(".")[0] == "numpy" and hasattr(cls, "flags") and hasattr(cls, "__array_interface__"):
        return _by_numpy
    if hasattr(cls, "__cuda_array_interface__"):
        return _by_cuda_interface
    if hasattr(cls, "__array_interface__"):
        return _by_array_interface
    if hasattr(cls, "__dlpack__") and hasattr(cls, "__dlpack_device__"):
        return _by_dlpack
    return _by_buffer


def resolve(obj, *, writable, what, consumer_stream=None):
    """A Side for obj; TypeError for an object that is no memory at all,
    ValueError for memory copy() cannot take (non-contiguous, read-only for a
    destination, closed)."""
    cls = type(obj)
    handler = _handlers.get(cls)
    if handler is None:
        if isinstance(obj, type):
            return _by_buffer(obj, writable, what, consumer_stream)
        handler = _handlers[cls] = _pick(cls)
    return handler(obj, writable, what, consumer_stream)
