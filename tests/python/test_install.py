"""pip install ./python: offline, with the library shipped in the package."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pinmem
from conftest import ROOT


def _has_pip():
    return subprocess.run([sys.executable, "-m", "pip", "--version"],
                          capture_output=True).returncode == 0


@pytest.mark.skipif(not _has_pip(), reason="pip is not installed for this Python")
def test_pip_install_ships_the_library(tmp_path):
    target = tmp_path / "site"
    env = dict(os.environ)
    env["PINMEM_LIBRARY"] = pinmem.library_path()  # ship the library under test, not a new build
    env["PIP_NO_INDEX"] = "1"  # nothing may come from the network
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    # pip may build in a copy of the folder: work on one in tmp, so the checkout stays clean
    src = tmp_path / "python"
    shutil.copytree(ROOT / "python", src, ignore=shutil.ignore_patterns("__pycache__", "build"))
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--target", str(target), str(src)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    shipped = list((target / "pinmem" / "_lib").glob("libpinmem.so*"))
    assert len(shipped) == 1
    env.pop("PINMEM_LIBRARY")
    env["PYTHONPATH"] = str(target)
    check = subprocess.run(
        [sys.executable, "-c", "import pinmem; print(pinmem.library_path()); "
         "b = pinmem.empty(4096); d = pinmem.device_empty(4096); pinmem.copy(d, b); print('ok')"],
        capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert check.returncode == 0, check.stderr
    path, ok = check.stdout.split()
    assert Path(path).resolve() == shipped[0].resolve() and ok == "ok"
