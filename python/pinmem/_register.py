"""pinmem.register: page-locking memory that already exists, in place."""

import threading

from . import _lib
from ._closing import Closing, free_in_forked_child
from ._errors import check
from ._resolve import DEVICE, HOST, disown, own, resolve

REGISTER_FLAGS = 0xF  # PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY
READ_ONLY = 0x8

# Re-entrant: a garbage collection while a thread holds it may close a
# Registration on that thread.
_lock = free_in_forked_child(threading.RLock())


class Registration(Closing):
    """Memory page-locked in place by :func:`pinmem.register`. The object
    stays alive (and, for buffer-protocol objects, exported, so that a
    bytearray cannot be resized) until ``close()``, the end of a ``with``
    block, or garbage collection unregisters it."""

    def __init__(self, *args, **kwargs):
        raise TypeError("pinmem.Registration is made by pinmem.register()")

    @property
    def ptr(self):
        if self._side is None:
            raise ValueError("the registration is closed")
        return self._address

    @property
    def nbytes(self):
        return self._nbytes

    @property
    def obj(self):
        """The registered object (None once closed)."""
        return self._obj

    @property
    def flags(self):
        return self._flags

    @property
    def closed(self):
        return self._side is None

    def _copy_side(self, writable, what, consumer_stream=None):
        # A copy running holds the registration: close() from another thread
        # would let the object (and its memory) go under it.
        with _lock:
            if self._side is None:
                raise ValueError(f"{what}: the registration is closed")
            if writable and self._flags & READ_ONLY:
                raise ValueError(f"{what}: the memory was registered read-only")
            self._copies += 1
        return (self._address, self._nbytes, HOST, None, self._copy_done)

    def _copy_done(self):
        with _lock:
            self._copies -= 1

    def close(self):
        """Unregisters the memory and lets the object go (a second close does nothing)."""
        with _lock:
            if self._side is not None and self._copies:
                raise BufferError("cannot close the registration: copies running in other "
                                  "threads still use it")
            side, self._side = self._side, None
        if side is None:
            return
        disown(self._address)
        try:
            check(_lib.load().pm_mem_host_unregister(self._address), "Registration.close")
        finally:
            side.release()
            self._obj = None

    def __repr__(self):
        state = "closed" if self._side is None else f"at {self._address:#x}"
        return f"<pinmem.Registration {self._nbytes} bytes {state}>"


def register(obj, *, flags=0):
    """Page-locks the memory of obj in place (cuMemHostRegister): any
    writable buffer-protocol object, numpy array or CPU torch tensor (with
    pinmem.HOSTREGISTER_READ_ONLY, read-only memory too). Returns a
    Registration; obj is kept alive until it is closed, but must not be
    resized meanwhile (that would move its memory out of the registration)."""
    from ._buffer import Buffer, DeviceBuffer

    if isinstance(flags, bool) or not isinstance(flags, int):
        raise TypeError(f"pinmem.register: flags must be an int, not {type(flags).__name__}")
    if flags & ~REGISTER_FLAGS:
        raise ValueError(f"pinmem.register: flags {flags:#x} has bits outside the "
                         f"HOSTREGISTER_* flags")
    if isinstance(obj, (int, Registration)):
        raise TypeError("pinmem.register takes an object that owns memory (an array, tensor or "
                        "buffer), not an address or a registration")
    if isinstance(obj, (Buffer, DeviceBuffer)):
        raise ValueError("pinmem.register: a pinmem buffer is page-locked already (or is device "
                         "memory)")
    side = resolve(obj, writable=not flags & READ_ONLY, what="pinmem.register")
    try:
        if side.nbytes is None:  # an integer of another type (a numpy integer, say)
            raise TypeError("pinmem.register takes an object that owns memory (an array, tensor "
                            "or buffer), not an address or a registration")
        if side.where == DEVICE:
            raise ValueError("pinmem.register pins host memory; this object's memory is on the "
                             "device")
        if side.nbytes == 0:
            raise ValueError("pinmem.register: the object is empty; there is nothing to pin")
        check(_lib.load().pm_mem_host_register(side.address, side.nbytes, flags), "pinmem.register")
    except BaseException:
        side.release()
        raise
    reg = object.__new__(Registration)
    reg._address = side.address
    reg._nbytes = side.nbytes
    reg._obj = obj
    reg._flags = flags
    reg._copies = 0
    reg._side = side
    own(side.address, side.nbytes, read_only=bool(flags & READ_ONLY))
    return reg
