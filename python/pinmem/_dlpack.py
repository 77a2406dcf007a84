"""DLPack through ctypes: exporting pinmem memory as a capsule, and reading
the address, size and layout of another framework's capsule."""

import ctypes
import threading

KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_CUDA_MANAGED = 13

DEVICE_NAMES = {"cpu": KDL_CPU, "cuda_host": KDL_CUDA_HOST}

# dtype name: (DLDataTypeCode, bits); kDLInt 0, kDLUInt 1, kDLFloat 2, kDLComplex 5, kDLBfloat 4, kDLBool 6
DTYPES = {
    "int8": (0, 8), "int16": (0, 16), "int32": (0, 32), "int64": (0, 64),
    "uint8": (1, 8), "uint16": (1, 16), "uint32": (1, 32), "uint64": (1, 64),
    "float16": (2, 16), "float32": (2, 32), "float64": (2, 64),
    "bfloat16": (4, 16), "complex64": (5, 64), "complex128": (5, 128), "bool": (6, 8),
}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
]

_NAME = b"dltensor"
_USED = b"used_dltensor"

_api = ctypes.pythonapi
_Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _Destructor]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
# The destructor gets the capsule as a raw pointer: it runs while the capsule dies.
_IsValidRaw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_is_valid_raw = _IsValidRaw(("PyCapsule_IsValid", ctypes.pythonapi))
_GetPointerRaw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)
_get_pointer_raw = _GetPointerRaw(("PyCapsule_GetPointer", ctypes.pythonapi))

# Exports alive: the address of each DLManagedTensor -> what it keeps alive.
_live = {}
_live_lock = threading.Lock()


def _deleter(managed, _live=_live, _lock=_live_lock, _addr=ctypes.addressof):
    # Called by the consumer (any thread; ctypes takes the GIL) when done;
    # possibly after this module's globals were cleared at shutdown.
    with _lock:
        _live.pop(_addr(managed.contents), None)


_deleter = _Deleter(_deleter)


def _capsule_destructor(capsule, _valid=_is_valid_raw, _get=_get_pointer_raw, _name=_NAME,
                        _live=_live, _lock=_live_lock):
    # A capsule never consumed still owns its tensor.
    if _valid(capsule, _name):
        address = _get(capsule, _name)
        if address:
            with _lock:
                _live.pop(address, None)


_capsule_destructor = _Destructor(_capsule_destructor)
# Immortal: consumers may call them during interpreter shutdown, after this
# module's globals are gone (and with them, otherwise, the thunks and _live).
_api.Py_IncRef.argtypes = [ctypes.py_object]
_api.Py_IncRef(_deleter)
_api.Py_IncRef(_capsule_destructor)


def dtype_code(dtype):
    """(code, bits) for a dtype given as a name, a numpy dtype or a torch dtype."""
    name = str(dtype)
    name = name[len("torch."):] if name.startswith("torch.") else name
    if name not in DTYPES:
        try:
            import numpy
            name = numpy.dtype(dtype).name
        except Exception:
            pass
    if name not in DTYPES:
        raise TypeError(f"DLPack: unsupported dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def export(address, shape, dtype, device, keep):
    """A "dltensor" capsule over address: C-contiguous, of shape and dtype
    ((code, bits)) on device ((type, id)); keep stays alive until the
    consumer calls the deleter (or the capsule dies unconsumed)."""
    managed = DLManagedTensor()
    shape_arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    t = managed.dl_tensor
    t.data = address or None
    t.device = DLDevice(*device)
    t.ndim = len(shape)
    t.dtype = DLDataType(dtype[0], dtype[1], 1)
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    t.strides = None
    t.byte_offset = 0
    managed.manager_ctx = None
    managed.deleter = _deleter
    key = ctypes.addressof(managed)
    with _live_lock:
        _live[key] = (managed, shape_arr, keep)
    return _api.PyCapsule_New(key, _NAME, _capsule_destructor)


def live_exports():
    """How many capsules' tensors are still held (for tests)."""
    with _live_lock:
        return len(_live)


class Imported:
    """What copy() needs from another framework's capsule."""

    __slots__ = ("address", "nbytes", "device_type", "device_id", "contiguous", "_capsule", "_managed")

    def release(self):
        managed, self._managed = self._managed, None
        if managed is not None and managed.contents.deleter:
            managed.contents.deleter(managed)


def import_capsule(capsule, what):
    """Reads a "dltensor" capsule and takes it over (the caller calls release())."""
    if not _api.PyCapsule_IsValid(capsule, _NAME):
        raise TypeError(f"{what}: __dlpack__() did not return a DLPack capsule (or one already used)")
    address = _api.PyCapsule_GetPointer(capsule, _NAME)
    managed = ctypes.cast(address, ctypes.POINTER(DLManagedTensor))
    _api.PyCapsule_SetName(capsule, _USED)
    t = managed.contents.dl_tensor
    out = Imported()
    out._capsule = capsule
    out._managed = managed
    bits = t.dtype.bits * max(t.dtype.lanes, 1)
    if bits % 8:
        out.release()
        raise ValueError(f"{what}: elements of {bits} bits are not whole bytes")
    itemsize = bits // 8
    shape = [t.shape[i] for i in range(t.ndim)]
    count = 1
    for s in shape:
        count *= s
    contiguous = True
    if t.strides and count:
        expected = 1
        for i in reversed(range(t.ndim)):
            if shape[i] != 1 and t.strides[i] != expected:
                contiguous = False
            expected *= shape[i]
    out.address = (t.data or 0) + t.byte_offset
    out.nbytes = count * itemsize
    out.device_type = t.device.device_type
    out.device_id = t.device.device_id
    out.contiguous = contiguous
    return out
