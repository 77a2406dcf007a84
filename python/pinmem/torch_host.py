"""pinmem.torch.install(): PyTorch's CUDA host allocator served by pinmem.

PyTorch lets an extension replace the allocator behind pin_memory(),
pin_memory=True, the DataLoader's pinning thread and non-blocking copies to
the host (at::setHostAllocator); install() needs PyTorch 2.11 or later
(NEEDED_TORCH), the versions it was built and tested with. It builds
that extension on first use (torch.utils.cpp_extension, cached like any
other extension; see pinmem.torch_build) and registers it, backed by a pinmem pool: pinned tensors
take the pool's size classes (at most 1/8 over) instead of the next power of
two, cold pinning is pinmem's, and a freed block is reused only after every
stream that used it is done, as with PyTorch's own allocator
(torch_host_allocator.cpp says how).
"""

import ctypes
import re
import threading
from pathlib import Path

import torch as _torch

from . import _lib
from ._pool import Pool

__all__ = ["install", "uninstall", "installed", "pool", "NEEDED_TORCH"]

#: The oldest PyTorch the allocator builds against: 2.8-2.10 can replace the
#: allocator too, but their at::HostAllocator has no graph-pool calls and
#: names its statistics differently, and the extension is not built there.
NEEDED_TORCH = (2, 11)

_SOURCE = Path(__file__).with_name("torch_host_allocator.cpp")
_FUNCTIONS = ("pm_mem_alloc_from_pool", "pm_mem_free", "pm_mem_pool_create", "pm_mem_pool_destroy",
              "pm_mem_pool_trim_to", "pm_mem_pool_get_stats", "pm_mem_pool_set_attribute",
              "pm_result_name", "pm_last_error_detail")

_lock = threading.Lock()
_extension = None
_pool = None


def _torch_version(text=None):
    """(major, minor) of a PyTorch version string such as "2.11.0+cu130"."""
    m = re.match(r"(\d+)\.(\d+)", text if text is not None else _torch.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _check_torch():
    have = _torch_version()
    if have < NEEDED_TORCH:
        raise RuntimeError(
            f"pinmem.torch.install() needs PyTorch {NEEDED_TORCH[0]}.{NEEDED_TORCH[1]} or later, "
            f"whose CUDA host allocator an extension can replace (at::setHostAllocator) with "
            f"CUDA graphs' private pools; this is "
            f"PyTorch {_torch.__version__}. pinmem.torch.to_device / to_host and the preload "
            f"library (python -m pinmem preload-path) work with it.")
    if _torch.version.cuda is None:
        raise RuntimeError(f"pinmem.torch.install() needs a CUDA build of PyTorch; "
                           f"{_torch.__version__} is built without CUDA")
    backend = _lib.load().pm_backend_name().decode()
    if backend != "cuda":
        raise RuntimeError(f"pinmem.torch.install() needs pinmem's CUDA backend (a GPU and its "
                           f"driver); pinmem runs on its {backend} backend here")


def _build():
    from . import torch_build

    try:
        return torch_build.load("pinmem_torch_host_allocator", _SOURCE, cuda=True)
    except (OSError, RuntimeError, ImportError) as e:
        raise RuntimeError(f"pinmem.torch.install(): the allocator extension could not be built "
                           f"with torch.utils.cpp_extension (it needs a C++ compiler and the CUDA "
                           f"toolkit's headers, found through CUDA_HOME): {e}") from e


def install(pool=None):
    """Makes pinmem serve PyTorch's CUDA host allocator, from pool (a
    pinmem.Pool; default: a new pool of its own, which keeps what it pins).
    Returns the pool, which can no longer be closed (BufferError): tensors
    pinned from it go back to it, even after uninstall(). Calling it again
    changes nothing. Raises RuntimeError,
    saying what is needed, on a PyTorch older than NEEDED_TORCH, a
    build without CUDA, or no CUDA backend for pinmem."""
    global _extension, _pool
    with _lock:
        _check_torch()
        if pool is not None and not isinstance(pool, Pool):
            raise TypeError(f"pinmem.torch.install: pool must be a pinmem.Pool, not "
                            f"{type(pool).__name__}")
        if _extension is None:
            _extension = _build()
        if _pool is not None and pool is not None and pool is not _pool:
            raise ValueError("pinmem.torch.install: already installed with another pool")
        chosen = _pool if _pool is not None else pool if pool is not None else Pool()
        lib = _lib.load()
        addresses = {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
                     for name in _FUNCTIONS}
        if _pool is None:
            # Tensors pinned from it go back to it whenever they die, even
            # after uninstall(): the pool may never be closed.
            chosen._keep("PyTorch's host allocator (pinmem.torch.install)")
            _pool = chosen
        _extension.install(_pool.handle, addresses)
        return _pool


def uninstall():
    """Puts back the allocator PyTorch had before install(). Tensors pinned
    meanwhile stay valid and go back to pinmem when freed. Raises
    RuntimeError while a CUDA graph captured with pinmem's allocator lives
    (PyTorch gives a graph's pool back to the allocator current when the
    graph dies): delete the graph first."""
    with _lock:
        if _extension is not None:
            _extension.uninstall()


def installed():
    """Whether PyTorch's CUDA host allocator is pinmem's now."""
    return _extension is not None and _extension.installed()


def pool():
    """The pinmem.Pool serving PyTorch's pinned memory (None before install())."""
    return _pool


def counts():
    """Blocks in use, freed but waiting for their streams, and held by CUDA
    graphs' pools (for tests); {} before install()."""
    return dict(_extension.counts()) if _extension is not None else {}
