"""pinmem: page-locked host memory and fast copies for Python GPU programs.

ctypes over libpinmem.so (see pinmem._lib for how the library is found).
The adapters for frameworks are modules of their own, imported on first
use: pinmem.torch, pinmem.cupy, pinmem.numba, pinmem.cuda_core.
"""

import ctypes as _ctypes
import importlib as _importlib

from . import _lib
from ._batch import copy_batch
from ._blocks import copy_blocks
from ._buffer import Buffer, DeviceBuffer, device_empty, empty
from ._copy import copy
from ._errors import PinmemError, PinmemMemoryError
from ._errors import check as _check
from ._lib import LibraryNotFound
from ._pool import Pool, stats
from ._register import Registration, register
from ._settings import settings
from ._stream import STREAM_LEGACY, STREAM_PER_THREAD, Stream

__version__ = "0.1.0"

__all__ = [
    "Buffer", "DeviceBuffer", "LibraryNotFound", "PinmemError", "PinmemMemoryError", "Pool",
    "Registration", "Stream", "backend", "capabilities", "copy", "copy_batch", "copy_blocks",
    "device_empty", "empty", "library_path", "register", "settings", "stats", "version",
    "HOSTALLOC_PORTABLE", "HOSTALLOC_DEVICEMAP", "HOSTALLOC_WRITECOMBINED",
    "HOSTREGISTER_PORTABLE", "HOSTREGISTER_DEVICEMAP", "HOSTREGISTER_IOMEMORY",
    "HOSTREGISTER_READ_ONLY", "STREAM_LEGACY", "STREAM_PER_THREAD",
]

HOSTALLOC_PORTABLE = 0x01
HOSTALLOC_DEVICEMAP = 0x02
HOSTALLOC_WRITECOMBINED = 0x04
HOSTREGISTER_PORTABLE = 0x01
HOSTREGISTER_DEVICEMAP = 0x02
HOSTREGISTER_IOMEMORY = 0x04
HOSTREGISTER_READ_ONLY = 0x08

_ADAPTERS = {"torch": "torch", "cupy": "cupy", "numba": "numba", "cuda_core": "cuda.core"}


def __getattr__(name):
    # pinmem.torch and friends load only when asked for, and only where
    # their framework imports.
    if name in _ADAPTERS:
        return _importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'pinmem' has no attribute {name!r}")


def version():
    """The version of the loaded libpinmem ("0.1.0")."""
    return _lib.load().pm_version_string().decode()


def library_path():
    """The path of the loaded libpinmem.so."""
    return _lib.path()


def backend():
    """"cuda" or "posix": the backend the library chose (PINMEM_BACKEND picks).

    Raises PinmemError when no backend could be initialised.
    """
    lib = _lib.load()
    _check(lib.pm_init(0), "pinmem.backend")
    name = lib.pm_backend_name()  # NULL, None here, when there is no backend
    if name is None:
        raise PinmemError("PM_ERROR_NOT_INITIALIZED", "pinmem.backend: no backend", 3)
    return name.decode()


def capabilities():
    """What the backend and the machine offer (pm_get_capabilities) as a dict."""
    lib = _lib.load()
    caps = _lib.Capabilities()
    caps.struct_size = _ctypes.sizeof(caps)
    _check(lib.pm_get_capabilities(_ctypes.byref(caps)), "pinmem.capabilities")
    out = {}
    for name, kind in _lib.Capabilities._fields_:
        if name == "struct_size":
            continue
        value = getattr(caps, name)
        out[name] = value.decode(errors="replace") if isinstance(value, bytes) else value
    for flag in ("can_map_host_memory", "unified_addressing", "can_use_host_pointer_for_registered_mem",
                 "read_only_host_register_supported", "pageable_memory_access_uses_host_page_tables",
                 "pinning_limited_by_memlock_rlimit", "access_checks_permissions"):
        out[flag] = bool(out[flag])
    return out
