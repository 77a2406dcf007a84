"""The PINMEM_* settings in effect (pm_get_setting), as pinmem info lists them."""

import ctypes

from . import _lib
from ._errors import check


def _text(raw):
    return raw.decode() if raw else ""


def settings():
    """Every PINMEM_* setting in effect: name -> dict of value, source ("default",
    "environment" or "code"), default, allowed and doc. The environment is read
    at the first call into the library, so a variable set before it counts."""
    lib = _lib.load()
    found = {}
    for index in range(1024):
        s = _lib.Setting()
        s.struct_size = ctypes.sizeof(s)
        r = lib.pm_get_setting(index, ctypes.byref(s))
        if r == _lib.PM_ERROR_NOT_FOUND:
            break
        check(r, "pinmem.settings")
        found[_text(s.name)] = {"value": _text(s.value), "source": _text(s.source),
                                "default": _text(s.default_value), "allowed": _text(s.allowed),
                                "doc": _text(s.doc)}
    return found
