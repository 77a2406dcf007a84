"""Finding and loading libpinmem.so, and the C declarations the package uses.

A libpinmem.so already in the process (the preload library,
libpinmem_preload.so, loads one for the CUDA runtime's calls) is used as it
is, so that a process has one pinmem. Otherwise the library is looked for, in
this order:

1. the path in the environment variable PINMEM_LIBRARY (nothing else is tried
   when it is set);
2. the copy shipped inside the installed package (pinmem/_lib/);
3. the build tree, when the package is imported from a source checkout
   (build-python/, build/, build-test/ beside python/);
4. the system's library path (libpinmem.so.MAJOR.MINOR, then libpinmem.so).

It is loaded on first use, so that ``import pinmem`` works without it and
``python -m pinmem info`` can say what was searched.
"""

import ctypes
import os
import threading
from pathlib import Path

# The oldest library this package works with (PM_VERSION_NUMBER), and the
# newest minor version it knows: the C API only grows within a major version.
NEEDED_VERSION = 100
SONAME = "libpinmem.so.0.1"

c_result = ctypes.c_int
c_size = ctypes.c_size_t
c_ptr = ctypes.c_void_p
c_devptr = ctypes.c_uint64


class Capabilities(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size),
        ("backend", ctypes.c_char * 16),
        ("driver_version", ctypes.c_int),
        ("device_ordinal", ctypes.c_int),
        ("device_name", ctypes.c_char * 128),
        ("can_map_host_memory", ctypes.c_int),
        ("unified_addressing", ctypes.c_int),
        ("can_use_host_pointer_for_registered_mem", ctypes.c_int),
        ("read_only_host_register_supported", ctypes.c_int),
        ("pageable_memory_access_uses_host_page_tables", ctypes.c_int),
        ("pinning_limited_by_memlock_rlimit", ctypes.c_int),
        ("host_numa_node", ctypes.c_int),
        ("page_size", c_size),
        ("huge_page_size", c_size),
        ("huge_page_mode", ctypes.c_char * 16),
        ("access_checks_permissions", ctypes.c_int),
    ]


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class PoolProps(ctypes.Structure):
    _fields_ = [
        ("location", MemLocation),
        ("handle_types", ctypes.c_uint),
        ("max_size", c_size),
        ("reserved", ctypes.c_ubyte * 64),
    ]


_ull = ctypes.c_ulonglong


class CopyStats(ctypes.Structure):
    """pm_copy_stats as far as this package knows it; the library fills up to
    struct_size, so a newer library with more fields still works."""

    _fields_ = [
        ("struct_size", c_size),
        ("direct_bytes", _ull),
        ("staged_bytes", _ull),
        ("driver_bytes", _ull),
        ("cached_bytes", _ull),
        ("cache_registrations", _ull),
        ("cache_hits", _ull),
        ("cache_invalidations", _ull),
        ("pinned_bytes", _ull),
        ("cache_listening", ctypes.c_int),
        ("staged_pieces", _ull),
        ("staging_copy_ns", _ull),
        ("staging_wait_ns", _ull),
        ("staging_queue_ns", _ull),
        ("htod_fillers", ctypes.c_uint),
        ("demoted_bytes", _ull),
    ]


class Setting(ctypes.Structure):
    _fields_ = [
        ("struct_size", c_size),
        ("name", ctypes.c_char_p),
        ("value", ctypes.c_char * 32),
        ("source", ctypes.c_char_p),
        ("default_value", ctypes.c_char_p),
        ("allowed", ctypes.c_char_p),
        ("doc", ctypes.c_char_p),
    ]


# name: (restype, argtypes)
_FUNCTIONS = {
    "pm_version": (ctypes.c_int, []),
    "pm_version_string": (ctypes.c_char_p, []),
    "pm_result_name": (ctypes.c_char_p, [c_result]),
    "pm_result_string": (ctypes.c_char_p, [c_result]),
    "pm_last_error_detail": (ctypes.c_char_p, []),
    "pm_last_driver_error": (ctypes.c_int, []),
    "pm_init": (c_result, [ctypes.c_uint]),
    "pm_backend_name": (ctypes.c_char_p, []),
    "pm_get_capabilities": (c_result, [ctypes.POINTER(Capabilities)]),
    "pm_mem_host_alloc": (c_result, [ctypes.POINTER(c_ptr), c_size, ctypes.c_uint]),
    "pm_mem_free_host": (c_result, [c_ptr]),
    "pm_mem_host_register": (c_result, [c_ptr, c_size, ctypes.c_uint]),
    "pm_mem_host_unregister": (c_result, [c_ptr]),
    "pm_mem_host_get_flags": (c_result, [ctypes.POINTER(ctypes.c_uint), c_ptr]),
    "pm_mem_check_access": (c_result, [c_devptr, c_size, ctypes.c_uint, ctypes.POINTER(c_devptr),
                                       ctypes.POINTER(c_size)]),
    "pm_stream_create": (c_result, [ctypes.POINTER(c_ptr)]),
    "pm_stream_destroy": (c_result, [c_ptr]),
    "pm_stream_synchronize": (c_result, [c_ptr]),
    "pm_event_create": (c_result, [ctypes.POINTER(c_ptr)]),
    "pm_event_destroy": (c_result, [c_ptr]),
    "pm_event_record": (c_result, [c_ptr, c_ptr]),
    "pm_stream_wait_event": (c_result, [c_ptr, c_ptr]),
    "pm_mem_pool_create": (c_result, [ctypes.POINTER(c_ptr), ctypes.POINTER(PoolProps)]),
    "pm_mem_pool_destroy": (c_result, [c_ptr]),
    "pm_mem_get_default_pool": (c_result, [ctypes.POINTER(c_ptr)]),
    "pm_mem_alloc_from_pool": (c_result, [ctypes.POINTER(c_ptr), c_size, c_ptr]),
    "pm_mem_alloc_from_pool_async": (c_result, [ctypes.POINTER(c_ptr), c_size, c_ptr, c_ptr]),
    "pm_mem_free": (c_result, [c_ptr]),
    "pm_mem_free_async": (c_result, [c_ptr, c_ptr]),
    "pm_mem_pool_trim_to": (c_result, [c_ptr, c_size]),
    "pm_mem_pool_set_attribute": (c_result, [c_ptr, ctypes.c_int, c_ptr]),
    "pm_mem_pool_get_attribute": (c_result, [c_ptr, ctypes.c_int, c_ptr]),
    "pm_mem_pool_stats_json": (c_result, [c_ptr, ctypes.c_char_p, c_size, ctypes.POINTER(c_size)]),
    "pm_copy_get_stats": (c_result, [ctypes.POINTER(CopyStats)]),
    "pm_get_setting": (c_result, [ctypes.c_uint, ctypes.POINTER(Setting)]),
    "pm_memcpy": (c_result, [c_devptr, c_devptr, c_size]),
    "pm_memcpy_async": (c_result, [c_devptr, c_devptr, c_size, c_ptr]),
    "pm_memcpy_batch_async": (c_result, [ctypes.POINTER(c_devptr), ctypes.POINTER(c_devptr),
                                         ctypes.POINTER(c_size), c_size, c_ptr]),
    "pm_device_alloc": (c_result, [ctypes.POINTER(c_devptr), c_size]),
    "pm_device_free": (c_result, [c_devptr]),
    "pm_dlpack_deleter": (None, [c_ptr]),
}

PM_ERROR_NOT_FOUND = 500
PM_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4
PM_MEM_LOCATION_TYPE_HOST = 2
PM_MEM_LOCATION_TYPE_HOST_NUMA = 3


class LibraryNotFound(ImportError):
    """libpinmem.so could not be loaded; the message lists where it was looked for."""


_lock = threading.Lock()
_lib = None
_path = None


def _source_root():
    """The checkout this package lies in (python/pinmem/ under it), or None."""
    root = Path(__file__).resolve().parent.parent.parent
    if (root / "include" / "pinmem.h").is_file() and (root / "CMakeLists.txt").is_file():
        return root
    return None


def candidates():
    """Where the library is looked for, in order (see the module's docstring)."""
    env = os.environ.get("PINMEM_LIBRARY")
    if env:
        return [env]
    found = []
    shipped = Path(__file__).resolve().parent / "_lib"
    if shipped.is_dir():
        found += sorted(str(p) for p in shipped.glob("libpinmem.so*"))
    root = _source_root()
    if root is not None:
        for build in ("build-python", "build", "build-test"):
            found.append(str(root / build / "libpinmem.so"))
    found += [SONAME, "libpinmem.so"]
    return found


def _declare(lib):
    for name, (restype, argtypes) in _FUNCTIONS.items():
        fn = getattr(lib, name)  # AttributeError: an older library
        fn.restype = restype
        fn.argtypes = argtypes


def _in_process():
    """The libpinmem.so of this soname already loaded in the process, or None."""
    try:
        return ctypes.CDLL(SONAME, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except (OSError, AttributeError):
        return None


def _usable(lib, cand, tried):
    """Declares the functions of lib; False (noted in tried) when it is too old."""
    try:
        _declare(lib)
    except AttributeError as e:
        tried.append(f"{cand} (too old for this package: {e})")
        return False
    version = lib.pm_version()
    if version < NEEDED_VERSION or version // 10000 != NEEDED_VERSION // 10000:
        tried.append(f"{cand} (version {version}, this package needs "
                     f"{NEEDED_VERSION // 10000}.{NEEDED_VERSION // 100 % 100} or a later "
                     f"minor version)")
        return False
    return True


def load():
    """The loaded library (a ctypes.CDLL); LibraryNotFound when there is none."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        lib = _in_process()
        if lib is not None and _usable(lib, f"{SONAME} (already loaded)", tried):
            _path = _loaded_path(lib, SONAME)
            _lib = lib
            return _lib
        for cand in candidates():
            is_path = os.sep in cand
            if is_path and not os.path.exists(cand):
                tried.append(f"{cand} (absent)")
                continue
            try:
                lib = ctypes.CDLL(cand)
            except OSError as e:
                tried.append(f"{cand} ({e})")
                continue
            if not _usable(lib, cand, tried):
                continue
            _path = cand if is_path else _loaded_path(lib, cand)
            _lib = lib
            return _lib
        raise LibraryNotFound(
            "pinmem: libpinmem.so was not found or could not be loaded; set PINMEM_LIBRARY to "
            "its path, install the package with pip (which builds and ships it), or build it "
            "with CMake. Tried: " + "; ".join(tried))


def _loaded_path(lib, name):
    """The file the dynamic loader chose for name."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "/libpinmem.so" in line:
                    return line[line.index("/"):].strip()
    except OSError:
        pass
    return name


def path():
    """The path of the loaded library (loading it if needed)."""
    load()
    return _path
