"""The address and size behind the objects copy() and register() take."""

import bisect
import ctypes
import operator
import re
import sys
import threading

from . import _access, _dlpack
from ._closing import free_in_forked_child

PyBUF_SIMPLE = 0


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

HOST = "host"
DEVICE = "device"
UNKNOWN = "unknown"  # an int address: the library tells


# The memory behind live pinmem objects (Buffer, DeviceBuffer, Registration),
# base address -> bytes, and the same bases sorted: each object adds its
# range when made and removes it before the memory goes, so an int address
# inside device memory of one needs no system call. Reads take no lock (copy() reads on every
# call); a read that races an update can only miss, and a miss asks the system.
# read_only: the bases of read-only registrations, which no copy may write;
# device: the bases of device memory.
owned = {}
_bases = []
_read_only = set()
_device = set()
_owned_lock = free_in_forked_child(threading.RLock())  # as _buffer._close_lock


def own(base, nbytes, read_only=False, device=False):
    """Records [base, base + nbytes) as the memory of a live pinmem object."""
    if not base:
        return
    with _owned_lock:
        if base not in owned:
            bisect.insort(_bases, base)
        owned[base] = nbytes
        if read_only:
            _read_only.add(base)
        if device:
            _device.add(base)


def disown(base):
    """Forgets the range at base; called before its memory is given back."""
    with _owned_lock:
        _read_only.discard(base)
        _device.discard(base)
        if owned.pop(base, None) is not None:
            i = bisect.bisect_left(_bases, base)
            if i < len(_bases) and _bases[i] == base:
                del _bases[i]


_after = bisect.bisect_right


def _owner(address, nbytes):
    """The base of the live pinmem object that holds [address, address +
    nbytes), or None."""
    n = owned.get(address)
    if n is not None and n >= nbytes:
        return address
    i = _after(_bases, address)
    if i:
        try:
            base = _bases[i - 1]
        except IndexError:  # shrunk meanwhile (free-threaded Python)
            return None
        n = owned.get(base)
        if n is not None and address + nbytes <= base + n:
            return base
    return None


_backend = []


def _cpu_copies():
    """Whether the CPU moves every byte a copy moves (the posix backend),
    device memory included, which its mapping then governs as any other."""
    if not _backend:
        from . import backend

        _backend.append(backend())
    return _backend[0] == "posix"


# The most ranges a batch remembers as good: each element looks through them.
_REMEMBERED = 16


def access_problem(address, nbytes, write, good=None, what="pinmem.copy"):
    """None when a copy may read (or, with write, write) [address, address +
    nbytes); else why not, as words to follow "the source" or "the
    destination" in an error. Inside a live pinmem object's device memory it
    may (on cuda); otherwise the library asks the system (_access). good: a list that keeps the
    mappings and device allocations found good between calls (a batch's),
    newest first."""
    base = _owner(address, nbytes)
    if base is not None:
        if write and base in _read_only:
            return f"address {address:#x} lies in memory registered read-only"
        # Host memory is checked even inside a pinmem object, since the program
        # may have made it inaccessible and the driver reads small copies of it
        # with the CPU; device memory has no mapping to ask on cuda.
        if base in _device and not _cpu_copies():
            return None
    if good:
        end = address + nbytes
        for lo, hi in good:
            if lo <= address and end <= hi:
                return None
    spans = None if good is None else []
    problem = _access.problem(address, nbytes, write, spans, what)
    if spans:
        good.insert(0, spans[0])
        del good[_REMEMBERED:]
    return problem


class Side:
    """One side of a copy or registration, as an object: where, how many
    bytes, on which side of the bus (as far as the object says), a stream the
    data is ordered on (the CUDA array interface's), and what to release
    afterwards. copy() takes the same five fields as the tuple a handler
    returns (see _pick), which costs less than an object per call."""

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


def _holds_objects(descr):
    """Whether an __array_interface__ descr has a field of Python objects,
    nested structures included."""
    for field in descr:
        kind = field[1] if isinstance(field, (tuple, list)) and len(field) > 1 else None
        if isinstance(kind, str) and kind[1:2] == "O":
            return True
        if isinstance(kind, list) and _holds_objects(kind):
            return True
    return False


# The array interface's typestr: byte order, kind, then the size in bytes
# (in characters of 4 bytes for kind U), and for datetimes a unit.
_TYPESTR = re.compile(r"[<>|=]([a-zA-Z])(\d+)(\[\w+\])?")


def _itemsize(typestr, what):
    if isinstance(typestr, str) and typestr[1:2] == "O":
        raise ValueError(f"{what}: an array of Python objects holds references, not bytes to copy")
    found = _TYPESTR.fullmatch(typestr) if isinstance(typestr, str) else None
    if found is None:
        raise ValueError(f"{what}: cannot read the element size from typestr {typestr!r}")
    size = int(found.group(2))
    return 4 * size if found.group(1) == "U" else size


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
    try:
        address = operator.index(address or 0) + operator.index(iface.get("offset", 0) or 0)
        shape = tuple(operator.index(n) for n in shape)
    except TypeError:
        address = -1
    if not 0 <= address < 1 << 64 or any(n < 0 for n in shape):
        raise ValueError(f"{what}: the {_name(obj)}'s array interface gives no address and shape "
                         f"(data {data!r}, shape {iface.get('shape')!r})")
    itemsize = _itemsize(iface.get("typestr", "|u1"), what)
    if _holds_objects(iface.get("descr", ())):
        raise ValueError(f"{what}: an array of Python objects holds references, not bytes to copy")
    if iface.get("mask") is not None:
        raise ValueError(f"{what}: masked arrays cannot be copied")
    if not _compact(shape, iface.get("strides"), itemsize):
        raise ValueError(f"{what}: the {_name(obj)} is not contiguous; copy only takes "
                         f"contiguous memory (make a contiguous copy first)")
    if writable and readonly:
        raise ValueError(f"{what}: the {_name(obj)} is read-only")
    count = 1
    for n in shape:
        count *= n
    if count * itemsize >= 1 << 64:
        raise ValueError(f"{what}: the {_name(obj)}'s array interface gives {count * itemsize} "
                         f"bytes, past the address space")
    stream = iface.get("stream") if where == DEVICE else None
    # Another library's host pointer is asked about as an int address is: a
    # wrong one must raise, not fault in the copy.
    return (address, count * itemsize, UNKNOWN if where == HOST else where, stream, None)


def _from_read_only(obj, what):
    """Read-only memory, whose address only the C API gives: the buffer
    stays exported until the copy is done."""
    view = _Py_buffer()
    ref = ctypes.byref(view)
    try:
        _api.PyObject_GetBuffer(obj, ref, PyBUF_SIMPLE)
    except BufferError as e:
        raise ValueError(f"{what}: the {_name(obj)} gives no usable buffer: {e}") from None
    return (view.buf or 0, view.len, HOST, None, lambda: _api.PyBuffer_Release(ref))


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
        where = UNKNOWN  # checked as an int address is (_from_interface says why)
    else:
        raise ValueError(f"{what}: DLPack device type {device_type} is not CPU or CUDA memory")
    imported = _dlpack.import_capsule(capsule, what)
    if not imported.contiguous:
        imported.release()
        raise ValueError(f"{what}: the {_name(obj)} is not contiguous; copy only takes contiguous "
                         f"memory")
    return (imported.address, imported.nbytes, where, None, imported.release)


# Handlers: handler(obj, writable, what, consumer_stream) -> (address, nbytes,
# where, stream, release), with nbytes None for an int address, stream the
# CUDA array interface's (or None) and release None or what to call when the
# copy is done.

def _by_int(obj, writable, what, consumer_stream):
    if obj < 0 or obj >= 1 << 64:
        raise ValueError(f"{what}: {obj} is not an address")
    return (obj, None, UNKNOWN, None, None)


def _by_bool(obj, writable, what, consumer_stream):
    raise TypeError(f"{what}: expected memory or an int address, not a bool")


def _by_numpy_int(obj, writable, what, consumer_stream):
    return _by_int(int(obj), writable, what, consumer_stream)


def _torch_handler(cls):
    strided = getattr(sys.modules.get("torch"), "strided", None)
    # the lazy conjugate and negative bits (torch 1.10 and later), read
    # through the type so that an older torch needs no test per call
    none = lambda t: False  # noqa: E731
    is_conj = getattr(cls, "is_conj", none)
    is_neg = getattr(cls, "is_neg", none)

    def by_torch(t, writable, what, consumer_stream):
        if t.layout is not strided:
            raise ValueError(f"{what}: sparse and other non-strided tensors cannot be copied")
        if not t.is_contiguous():
            raise ValueError(f"{what}: the tensor is not contiguous; call .contiguous() first")
        if is_conj(t) or is_neg(t):
            bit = "conj" if is_conj(t) else "neg"
            raise ValueError(f"{what}: the tensor has a lazy {bit} bit; call .resolve_{bit}() first")
        if t.is_cuda:
            where = DEVICE
        elif getattr(t, "is_cpu", False) or t.device.type == "cpu":
            where = HOST
        else:
            raise ValueError(f"{what}: tensors on {t.device.type} are not supported (cpu or cuda "
                             f"only)")
        return (t.data_ptr(), t.numel() * t.element_size(), where, None, None)

    return by_torch


def _by_interface(name, where):
    def handler(obj, writable, what, consumer_stream):
        iface = getattr(obj, name)
        side = _from_interface(iface, obj, writable, what, where) if isinstance(iface, dict) else None
        return side if side is not None else _by_buffer(obj, writable, what, consumer_stream)
    return handler


_by_cuda_interface = _by_interface("__cuda_array_interface__", DEVICE)
_by_array_interface = _by_interface("__array_interface__", HOST)


def _check_ndarray(obj, writable, what):
    # numpy's flags are cheap to read; its __array_interface__ dict is not.
    flags = obj.flags
    if not flags.c_contiguous:
        raise ValueError(f"{what}: the ndarray is not contiguous; copy only takes contiguous "
                         f"memory (numpy.ascontiguousarray makes a contiguous copy)")
    if writable and not flags.writeable:
        raise ValueError(f"{what}: the ndarray is read-only")
    if obj.dtype.hasobject:
        raise ValueError(f"{what}: an array of Python objects holds references, not bytes to copy")


def _by_numpy(obj, writable, what, consumer_stream):
    _check_ndarray(obj, writable, what)
    return (obj.__array_interface__["data"][0], obj.nbytes, HOST, None, None)


def _ndarray_data():
    """A function reading an ndarray's data pointer where numpy's C API keeps
    it (PyArray_DATA: the field right after the object header, which every
    compiled extension relies on), or None when a probe finds it elsewhere.
    Building __array_interface__ for the address costs most of a copy call."""
    numpy = sys.modules.get("numpy")
    at = object.__basicsize__
    read = ctypes.c_void_p.from_address

    def data(a):
        return read(id(a) + at).value or 0

    try:
        probe = numpy.arange(64, dtype=numpy.uint8)
        for a in (probe, probe[3:], probe.reshape(8, 8)[2:5], numpy.zeros(3, dtype=numpy.float64)):
            if data(a) != a.__array_interface__["data"][0]:
                return None
    except Exception:
        return None
    return data


def _numpy_handler(cls):
    numpy = sys.modules.get("numpy")
    data = _ndarray_data() if issubclass(cls, getattr(numpy, "ndarray", ())) else None
    if data is None:
        return _by_numpy

    def by_ndarray(obj, writable, what, consumer_stream):
        _check_ndarray(obj, writable, what)
        return (data(obj), obj.nbytes, HOST, None, None)

    return by_ndarray


def _by_dlpack(obj, writable, what, consumer_stream):
    return _from_dlpack(obj, writable, what, consumer_stream)


_char_at = ctypes.c_char.from_buffer


def _by_buffer(obj, writable, what, consumer_stream):
    try:
        view = memoryview(obj)
    except TypeError:
        if what.startswith("pinmem.register"):  # which takes neither pinmem memory nor addresses
            takes = ("a tensor or array (torch, numpy or anything with __array_interface__ or "
                     "DLPack) or an object with the writable buffer protocol")
        else:
            takes = ("a pinmem.Buffer, a tensor or array (torch, CuPy, numpy or anything with "
                     "__cuda_array_interface__, __array_interface__ or DLPack), an object with "
                     "the buffer protocol, or an int address")
        raise TypeError(f"{what}: cannot take the memory of a {_name(obj)}; pass {takes}") from None
    except BufferError as e:
        raise ValueError(f"{what}: the {_name(obj)} gives no usable buffer: {e}") from None
    if not view.c_contiguous:
        view.release()
        raise ValueError(f"{what}: the {_name(obj)} is not contiguous; copy only takes contiguous "
                         f"memory")
    if view.readonly:
        view.release()
        if writable:
            raise ValueError(f"{what}: the {_name(obj)} is read-only")
        return _from_read_only(obj, what)
    # The view keeps the memory exported (a bytearray cannot be resized)
    # until the copy is done; its address is read through a ctypes object
    # that goes at once.
    nbytes = view.nbytes
    return (ctypes.addressof(_char_at(view)) if nbytes else 0, nbytes, HOST, None, view.release)


# How each type's memory is found, learnt from its first object: every
# interface consulted is an attribute of the type, so the choice holds for
# all its objects. Bounded: before Python 3.12 each size of Buffer is a type
# of its own, and programs may make types without end.
handlers = {int: _by_int, bool: _by_bool}
_HANDLERS_MAX = 1024


def _pick(cls):
    from ._buffer import Buffer, DeviceBuffer
    from ._register import Registration

    if issubclass(cls, bool):
        return _by_bool
    if issubclass(cls, int):
        return _by_int
    if issubclass(cls, (Buffer, DeviceBuffer, Registration)):
        return cls._copy_side  # called unbound: (obj, writable, what, consumer_stream)
    torch = sys.modules.get("torch")
    if torch is not None and issubclass(cls, torch.Tensor):  # subclasses too
        return _torch_handler(cls)
    numpy = sys.modules.get("numpy")
    if numpy is not None and issubclass(cls, numpy.generic):
        # A scalar's array interface points into a temporary array, gone once
        # read; its buffer is its own (read-only). Integers are addresses.
        return _by_numpy_int if issubclass(cls, numpy.integer) else _by_buffer
    mod = cls.__module__ or ""
    if mod.split(".")[0] == "numpy" and hasattr(cls, "flags") and hasattr(cls, "__array_interface__"):
        return _numpy_handler(cls)
    if hasattr(cls, "__cuda_array_interface__"):
        return _by_cuda_interface
    if hasattr(cls, "__array_interface__"):
        return _by_array_interface
    if hasattr(cls, "__dlpack__") and hasattr(cls, "__dlpack_device__"):
        return _by_dlpack
    return _by_buffer


def handler(obj):
    """The handler for obj's type, learnt on first use (copy() reads the
    table itself first)."""
    cls = type(obj)
    found = handlers.get(cls)
    if found is None:
        if isinstance(obj, type):
            return _by_buffer
        found = _pick(cls)
        if len(handlers) >= _HANDLERS_MAX:
            handlers.clear()  # learnt again as used; copy() may read it meanwhile
            handlers.update({int: _by_int, bool: _by_bool})
        handlers[cls] = found
    return found


def resolve(obj, *, writable, what, consumer_stream=None):
    """A Side for obj; TypeError for an object that is no memory at all,
    ValueError for memory copy() cannot take (non-contiguous, read-only for a
    destination, closed)."""
    address, nbytes, where, stream, release = handler(obj)(obj, writable, what, consumer_stream)
    return Side(address, nbytes, where, stream, release, keep=obj)
