"""pinmem.backend() where no backend could be initialised: the C call answers
NULL, and Python raises PinmemError rather than failing on None."""

import os
import subprocess
import sys
import textwrap

import pinmem


def run_without_backend(code):
    env = dict(os.environ)
    env["PINMEM_BACKEND"] = "bogus"
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(pinmem.__file__))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env)


def test_backend_name_is_null_without_a_backend():
    run = run_without_backend("""
        from pinmem import _lib
        print(repr(_lib.load().pm_backend_name()))
    """)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "None"


def test_backend_raises_without_a_backend():
    run = run_without_backend("""
        import pinmem
        try:
            pinmem.backend()
        except pinmem.PinmemError as e:
            print(e.result)
    """)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "PM_ERROR_INVALID_VALUE"
