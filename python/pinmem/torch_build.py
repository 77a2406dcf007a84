"""Building a PyTorch C++ extension of this package, once, for pinmem.torch.

torch.utils.cpp_extension.load builds and caches it where ninja is installed.
Without ninja, the same flags and paths (from torch.utils.cpp_extension and
torch._C) go to the C++ compiler directly, and the result is cached under
PINMEM_TORCH_EXTENSIONS_DIR (default ~/.cache/pinmem/torch_extensions), keyed
by the source, the PyTorch version and the flags.
"""

import hashlib
import importlib.util
import os
import subprocess
import sysconfig
from pathlib import Path

import torch as _torch


def _paths(kind, cuda):
    from torch.utils import cpp_extension

    fn = getattr(cpp_extension, kind)
    try:
        return list(fn(device_type="cuda" if cuda else "cpu"))
    except TypeError:  # PyTorch before 2.5: a cuda flag
        return list(fn(cuda=cuda))


def _flags(name, cuda):
    c = _torch._C
    flags = ["-O2", "-fPIC", "-shared", "-std=c++17", f"-DTORCH_EXTENSION_NAME={name}",
             "-DTORCH_API_INCLUDE_EXTENSION_H",
             f"-D_GLIBCXX_USE_CXX11_ABI={int(c._GLIBCXX_USE_CXX11_ABI)}"]
    for key in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
        value = getattr(c, f"_PYBIND11_{key}", None)
        if value is not None:
            flags.append(f'-DPYBIND11_{key}="{value}"')
    flags += [f"-I{p}" for p in _paths("include_paths", cuda)]
    flags.append(f"-I{sysconfig.get_paths()['include']}")
    libs = [f"-L{p}" for p in _paths("library_paths", cuda)]
    libs += [f"-Wl,-rpath,{p}" for p in _paths("library_paths", cuda)]
    libs += ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    if cuda:
        libs += ["-lc10_cuda", "-ltorch_cuda", "-lcudart"]
    return flags, libs


def missing_headers():
    """None when PyTorch's C++ headers are installed, else what to install:
    Debian's python3-torch ships only dangling links to them (libtorch-dev)."""
    if any((Path(p) / "c10" / "macros" / "Macros.h").is_file()
           for p in _paths("include_paths", False)):
        return None
    return "PyTorch's C++ headers are not installed (Debian: libtorch-dev)"


def _compile(name, source, cuda):
    flags, libs = _flags(name, cuda)
    text = Path(source).read_bytes()
    key = hashlib.sha256(text + repr((_torch.__version__, flags, libs)).encode()).hexdigest()[:16]
    root = Path(os.environ.get("PINMEM_TORCH_EXTENSIONS_DIR")
                or Path.home() / ".cache" / "pinmem" / "torch_extensions")
    out = root / f"{name}-{key}" / f"{name}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        cmd = [os.environ.get("CXX", "c++"), str(source), "-o", str(tmp)] + flags + libs
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}\n{run.stderr[-4000:]}")
        os.replace(tmp, out)
    spec = importlib.util.spec_from_file_location(name, out)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load(name, source, *, cuda):
    """The extension module built from source (a C++ file defining
    PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)), built on first use."""
    from torch.utils import cpp_extension

    missing = missing_headers()
    if missing is not None:
        raise RuntimeError(f"cannot build {name}: {missing}")
    if cpp_extension.is_ninja_available():
        return cpp_extension.load(name=name, sources=[str(source)], with_cuda=cuda,
                                  extra_cflags=["-O2"],
                                  verbose=os.environ.get("PINMEM_TORCH_BUILD_VERBOSE") == "1")
    return _compile(name, source, cuda)
