"""A PEP 517 build backend for pinmem that needs only the standard library.

build_wheel builds libpinmem.so with CMake (the checkout around python/,
into build-python/) and ships it as pinmem/_lib/libpinmem.so.MAJOR.MINOR,
with the preload library beside it (pinmem/_lib/libpinmem_preload.so), so
the wheel is tagged for this platform. Environment:
  PINMEM_LIBRARY=/path/libpinmem.so   ship this library (and the preload
                                      library beside it, if there is one)
                                      instead of building them
  PINMEM_BUILD_LIBRARY=0              ship no library (pure-Python wheel)
  PINMEM_CMAKE_ARGS="..."             extra CMake arguments for the build
"""

import base64
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sysconfig
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent  # python/
ROOT = HERE.parent                              # the checkout
NAME = "pinmem"


def _version():
    text = (HERE / "pinmem" / "__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', text, re.M).group(1)


def _soname():
    text = (HERE / "pinmem" / "_lib.py").read_text()
    return re.search(r'^SONAME = "([^"]+)"', text, re.M).group(1)


def _metadata():
    readme = HERE / "README.md"
    body = readme.read_text() if readme.is_file() else ""
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {_version()}\n"
            "Summary: Page-locked host memory and fast host-device copies for numpy, PyTorch, "
            "CuPy, Numba and cuda.core\nRequires-Python: >=3.9\n"
            "Description-Content-Type: text/markdown\n\n" + body)


def _library():
    """The libpinmem.so to ship, or None."""
    given = os.environ.get("PINMEM_LIBRARY")
    if given:
        if not os.path.isfile(given):
            raise RuntimeError(f"PINMEM_LIBRARY={given} is not a file")
        return Path(given)
    if os.environ.get("PINMEM_BUILD_LIBRARY", "1") == "0":
        return None
    if not (ROOT / "CMakeLists.txt").is_file() or not (ROOT / "include" / "pinmem.h").is_file():
        raise RuntimeError(
            "pinmem: the C sources are not around python/ (an sdist or a copied folder?); set "
            "PINMEM_LIBRARY to a built libpinmem.so, or PINMEM_BUILD_LIBRARY=0 to ship none")
    cmake = shutil.which("cmake")
    if not cmake:
        raise RuntimeError("pinmem: cmake is needed to build libpinmem.so (or set PINMEM_LIBRARY)")
    build = ROOT / "build-python"
    args = [cmake, "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_TESTING=OFF"] + shlex.split(os.environ.get("PINMEM_CMAKE_ARGS", ""))
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    jobs = str(os.cpu_count() or 2)
    subprocess.run([cmake, "--build", str(build), "--target", "pinmem_shared", "pinmem_preload",
                    "-j", jobs], check=True, stdout=subprocess.DEVNULL)
    return build / "libpinmem.so"


def _record_line(arcname, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _package_files():
    for path in sorted((HERE / NAME).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc" \
                and "_lib" not in path.relative_to(HERE / NAME).parts:
            yield path.relative_to(HERE).as_posix(), path.read_bytes()


def _dist_info():
    return f"{NAME}-{_version()}.dist-info"


def _wheel_text(tag, purelib):
    return (f"Wheel-Version: 1.0\nGenerator: pinmem_build\nRoot-Is-Purelib: "
            f"{'true' if purelib else 'false'}\nTag: {tag}\n")


def _write_wheel(wheel_directory, files, tag, purelib):
    name = f"{NAME}-{_version()}-{tag}.whl"
    info = _dist_info()
    files = list(files) + [(f"{info}/METADATA", _metadata().encode()),
                           (f"{info}/WHEEL", _wheel_text(tag, purelib).encode())]
    record = [_record_line(a, d) for a, d in files] + [f"{info}/RECORD,,"]
    files.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    with zipfile.ZipFile(Path(wheel_directory) / name, "w", zipfile.ZIP_DEFLATED) as z:
        for arcname, data in files:
            zi = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = (0o755 if arcname.endswith(".so") or ".so." in arcname else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return name


def _platform_tag():
    return re.sub(r"[-.]", "_", sysconfig.get_platform())


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    info = Path(metadata_directory) / _dist_info()
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(_metadata())
    return info.name


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = list(_package_files())
    lib = _library()
    if lib is None:
        return _write_wheel(wheel_directory, files, "py3-none-any", True)
    files.append((f"{NAME}/_lib/{_soname()}", lib.read_bytes()))
    preload = lib.parent / "libpinmem_preload.so"
    if preload.is_file():
        files.append((f"{NAME}/_lib/{preload.name}", preload.read_bytes()))
    return _write_wheel(wheel_directory, files, f"py3-none-{_platform_tag()}", False)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """An editable install: a .pth that puts python/ on sys.path. The library
    is then found in the build tree (or through PINMEM_LIBRARY)."""
    pth = (f"{NAME}_editable.pth", (str(HERE) + "\n").encode())
    return _write_wheel(wheel_directory, [pth], "py3-none-any", True)


def build_sdist(sdist_directory, config_settings=None):
    """The Python sources only: building a wheel from it needs PINMEM_LIBRARY
    (or PINMEM_BUILD_LIBRARY=0), since the C sources are not in it."""
    base = f"{NAME}-{_version()}"
    name = f"{base}.tar.gz"
    with tarfile.open(Path(sdist_directory) / name, "w:gz") as tar:
        for rel in ["pyproject.toml", "README.md", "build_backend/pinmem_build.py"]:
            if (HERE / rel).is_file():
                tar.add(HERE / rel, arcname=f"{base}/{rel}")
        for arcname, _ in _package_files():
            tar.add(HERE / arcname, arcname=f"{base}/{arcname}")
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        data = _metadata().encode()
        info.size = len(data)
        import io
        tar.addfile(info, io.BytesIO(data))
    return name
