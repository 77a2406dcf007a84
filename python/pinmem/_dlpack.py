"""DLPack through ctypes: exporting pinmem memory as a capsule, and reading
the address, size and layout of another framework's capsule."""

import ctypes
import gc
import sys
import threading

from . import _lib
from ._closing import free_in_forked_child

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
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

# Exports alive: the address of each DLManagedTensor -> [the tensor, its
# shape, what it keeps alive, its capsule until a consumer takes it]. No
# Python code runs when a capsule dies or a consumer lets go of a tensor:
# either may happen while an exception propagates, when a callback into
# Python cannot run. The capsule has no destructor, and the deleter is
# libpinmem's pm_dlpack_deleter, which only clears manager_ctx; collect()
# lets go of what both show is over.
_live = {}
# Re-entrant: a garbage collection inside collect() may run a finalizer that
# closes a Buffer, whose close() collects again on this thread.
_live_lock = free_in_forked_child(threading.RLock())
_collect_at = [64]  # collect once the exports alive reach this many


def _unreferenced_count():
    """What sys.getrefcount answers for an object held by one list only."""
    held = [object()]
    return sys.getrefcount(held[0])


_UNREFERENCED = _unreferenced_count()


def collect(blocking=True):
    """Lets go of the exports that are over: a capsule nobody else holds and
    no consumer took, or a tensor whose consumer called the deleter. Without
    blocking, does nothing where another thread (or this one) is at it."""
    if not _live_lock.acquire(blocking=blocking):
        return
    over = []  # let go of after the lock: what they keep may run code as it goes
    try:
        for key, entry in list(_live.items()):
            if key not in _live:
                continue  # let go of by a collect() nested in this one
            if entry[3] is not None:
                if not _api.PyCapsule_IsValid(entry[3], _NAME):
                    entry[3] = None  # taken: the consumer's deleter says when it is done
                elif sys.getrefcount(entry[3]) <= _UNREFERENCED:
                    over.append(_live.pop(key, None))  # never taken, and gone from every other hand
                    continue
            if entry[3] is None and entry[0].manager_ctx is None:
                over.append(_live.pop(key, None))
        _collect_at[0] = max(64, 2 * len(_live))
    finally:
        _live_lock.release()
    del over


def _after_gc(phase, info, _live=_live, _collect=collect):
    # A buffer that only a dead tensor's export held goes at the garbage
    # collector's next pass over its older generations, not only at the next
    # export. Not blocking: the pass may run inside collect() itself. At
    # shutdown the module's globals may be gone: nothing is left to let go.
    if phase == "stop" and info.get("generation", 0) >= 1 and _live:
        try:
            _collect(blocking=False)
        except Exception:
            pass


gc.callbacks.append(_after_gc)


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
    key = ctypes.addressof(managed)
    managed.manager_ctx = key  # cleared by the deleter
    lib = _lib._lib or _lib.load()
    managed.deleter = ctypes.cast(lib.pm_dlpack_deleter, _Deleter)
    if len(_live) >= _collect_at[0]:
        collect()
    capsule = _api.PyCapsule_New(key, _NAME, None)
    with _live_lock:
        _live[key] = [managed, shape_arr, keep, capsule]
    return capsule


def live_exports():
    """How many capsules' tensors are still held, once those over are let go
    (for tests)."""
    collect()
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
