"""PinmemError: every failing call of the C library, as a Python exception."""

from . import _lib


class PinmemError(Exception):
    """A pinmem call failed.

    ``result`` is the C result's name (for example ``"PM_ERROR_INVALID_VALUE"``),
    ``code`` its number (CUDA's CUresult value where the meaning is the same),
    ``detail`` the library's sentence on why, and ``driver_error`` the raw CUDA
    driver code behind it (0 when the failure did not come from the driver).
    Out-of-memory failures raise :class:`PinmemMemoryError`, which is also a
    ``MemoryError``.
    """

    def __init__(self, result, detail="", code=None, driver_error=0):
        self.result = result
        self.detail = detail
        self.code = code
        self.driver_error = driver_error
        super().__init__(f"{result}: {detail}" if detail else result)

    def __reduce__(self):
        return (type(self), (self.result, self.detail, self.code, self.driver_error))


class PinmemMemoryError(PinmemError, MemoryError):
    """The memory could not be allocated or page-locked (PM_ERROR_OUT_OF_MEMORY)."""


OUT_OF_MEMORY = 2


def error(code, what=None):
    """The exception for result ``code`` of the call just made on this thread."""
    lib = _lib.load()
    name = (lib.pm_result_name(code) or b"PM_ERROR_UNRECOGNIZED").decode()
    detail = (lib.pm_last_error_detail() or b"").decode(errors="replace")
    if not detail:
        detail = (lib.pm_result_string(code) or b"").decode(errors="replace")
    if what:
        detail = f"{what}: {detail}"
    cls = PinmemMemoryError if code == OUT_OF_MEMORY else PinmemError
    return cls(name, detail, code, lib.pm_last_driver_error())


def check(code, what=None):
    """Raises for a failing result; returns nothing otherwise."""
    if code:
        raise error(code, what)
