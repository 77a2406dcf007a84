"""Where libpinmem_preload.so is: ``python -m pinmem preload-path``.

The preload library serves the CUDA runtime's pinned-memory and copy calls
of programs that never call pinmem (``LD_PRELOAD=$(python -m pinmem
preload-path) python train.py``). It is installed beside libpinmem.so: in
the package's _lib, in a build tree, or in an install's library directory.
"""

import os
from pathlib import Path

from . import _lib

NAME = "libpinmem_preload.so"


def candidates():
    """Where the preload library is looked for, in order: beside the
    libpinmem.so this package loads, in the package's _lib, in the build
    trees of a checkout."""
    found = []
    try:
        found.append(Path(_lib.path()).resolve().parent / NAME)
    except _lib.LibraryNotFound:
        pass
    found.append(Path(__file__).resolve().parent / "_lib" / NAME)
    root = _lib._source_root()
    if root is not None:
        found += [root / build / NAME for build in ("build-python", "build", "build-test")]
    return found


def path():
    """The absolute path of libpinmem_preload.so; FileNotFoundError (listing
    where it was looked for) when there is none."""
    tried = candidates()
    for cand in tried:
        if cand.is_file():
            return os.path.realpath(cand)
    raise FileNotFoundError("pinmem: libpinmem_preload.so was not found; looked in "
                            + ", ".join(str(c) for c in tried))
