"""The preload library from Python: python -m pinmem preload-path, the wheel
shipping it, and one pinmem per process when a program runs under it and
imports the package, whichever loads libpinmem first (against the tests'
stand-in CUDA runtime, built in the same build tree)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pinmem
from conftest import ROOT
from pinmem import _preload


def _preload_path():
    try:
        return Path(_preload.path())
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_preload_path_command():
    expected = _preload_path()
    env = dict(os.environ)
    # The package as this test imports it: the tree's, or the installed one
    # (whose site directory may itself be on PYTHONPATH).
    if os.environ.get("PINMEM_TEST_INSTALLED") != "1":
        env["PYTHONPATH"] = str(ROOT / "python")
    run = subprocess.run([sys.executable, "-m", "pinmem", "preload-path"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    printed = Path(run.stdout.strip())
    assert printed.is_absolute() and printed == expected
    # beside the libpinmem.so the package loads
    assert printed.parent == Path(pinmem.library_path()).resolve().parent


def test_preload_path_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(_preload, "candidates", lambda: [tmp_path / _preload.NAME])
    with pytest.raises(FileNotFoundError, match="libpinmem_preload.so was not found"):
        _preload.path()


def _stand_in_runtime():
    """The tests' stand-in libcudart.so.13 of the build tree the preload lies in."""
    fake = _preload_path().parent / "tests" / "preload" / "fake" / "libcudart.so.13"
    if not fake.is_file():
        pytest.skip("the stand-in CUDA runtime is not built here (tests/preload)")
    return fake


# Runs under the preload: pins through the runtime's cudaMallocHost (which
# the preload serves) and asks the package's pinmem about the pointer. With
# two libpinmem instances the package's would not know it; and a second copy
# of the library may not load at all (its thread-local storage must fit what
# the process has left).
_PROGRAM = r"""
import ctypes, os, sys
order = sys.argv[1]
if order == "package-first":
    import pinmem
    pinmem.backend()
ctypes.CDLL("libcudart.so.13")  # the stand-in runtime, loaded locally as plugins load it
cuda = ctypes.CDLL(None)  # the process's global scope: the preload's functions
p = ctypes.c_void_p()
assert cuda.cudaMallocHost(ctypes.byref(p), ctypes.c_size_t(1 << 16)) == 0
if order == "library-set-after":
    os.environ["PINMEM_LIBRARY"] = sys.argv[2]  # another copy: the loaded one must win
import pinmem
lib = pinmem._lib.load()
flags = ctypes.c_uint()
known = lib.pm_mem_host_get_flags(ctypes.byref(flags), p) == 0
assert cuda.cudaFreeHost(p) == 0
maps = {line.split()[-1] for line in open("/proc/self/maps") if "/libpinmem.so" in line}
print(known, len(maps), pinmem.library_path())
"""


@pytest.mark.parametrize("order", ["preload-first", "package-first", "library-set-after"])
def test_one_pinmem_with_the_preload(tmp_path, order):
    preload = _preload_path()
    fake = _stand_in_runtime()
    # The package as installed, with its own copy of the library: not the file
    # the preload would load beside itself.
    site = tmp_path / "site"
    shutil.copytree(ROOT / "python" / "pinmem", site / "pinmem",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (site / "pinmem" / "_lib").mkdir(exist_ok=True)
    shipped = site / "pinmem" / "_lib" / pinmem._lib.SONAME
    shutil.copy(Path(pinmem.library_path()).resolve(), shipped)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINMEM_")}
    env.update(PYTHONPATH=str(site), PINMEM_BACKEND="posix",
               LD_LIBRARY_PATH=str(fake.parent),
               LD_PRELOAD=":".join(filter(None, [os.environ.get("LD_PRELOAD"), str(preload)])))
    run = subprocess.run([sys.executable, "-c", _PROGRAM, order, str(shipped)],
                         capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=120)
    assert run.returncode == 0, run.stderr
    known, instances, path = run.stdout.split()
    assert known == "True" and instances == "1"
    loaded_first = shipped if order == "package-first" else preload.parent / shipped.name
    assert Path(path).resolve() == loaded_first.resolve()


def _has_pip():
    return subprocess.run([sys.executable, "-m", "pip", "--version"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not _has_pip(), reason="pip is not installed for this Python")
def test_wheel_ships_the_preload(tmp_path):
    preload = _preload_path()
    target = tmp_path / "site"
    env = dict(os.environ, PINMEM_LIBRARY=pinmem.library_path(), PIP_NO_INDEX="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    src = tmp_path / "python"
    shutil.copytree(ROOT / "python", src, ignore=shutil.ignore_patterns("__pycache__", "build"))
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--target", str(target), str(src)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    shipped = target / "pinmem" / "_lib" / "libpinmem_preload.so"
    assert shipped.read_bytes() == preload.read_bytes()
    env.pop("PINMEM_LIBRARY")
    env["PYTHONPATH"] = str(target)
    run = subprocess.run([sys.executable, "-m", "pinmem", "preload-path"], capture_output=True,
                         text=True, env=env, cwd=str(tmp_path), timeout=120)
    assert run.returncode == 0, run.stderr
    assert Path(run.stdout.strip()) == shipped.resolve()
