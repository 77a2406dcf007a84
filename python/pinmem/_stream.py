"""Streams: pinmem's own (Stream) and the handles other frameworks' streams carry."""

import ctypes

from . import _lib
from ._closing import Handled
from ._errors import check

# The driver's named stream handles (PM_STREAM_LEGACY, PM_STREAM_PER_THREAD):
# the legacy default stream and the calling thread's own default stream.
STREAM_LEGACY = 0x1
STREAM_PER_THREAD = 0x2


class Stream(Handled):
    """A pinmem stream (pm_stream_create): a CUDA stream on the cuda backend,
    an ordered queue run by a thread of its own on the posix backend. Pass it,
    or any framework's stream, as ``stream=`` to :func:`pinmem.copy`."""

    _noun = "stream"

    def __init__(self):
        lib = _lib.load()
        handle = ctypes.c_void_p()
        check(lib.pm_stream_create(ctypes.byref(handle)), "pinmem.Stream")
        self._handle = handle.value

    @property
    def handle(self):
        """The pm_stream_t (on cuda, the CUstream) as an int."""
        if self._handle is None:
            raise ValueError("the stream is closed")
        return self._handle

    @property
    def closed(self):
        return self._handle is None

    def synchronize(self):
        """Waits for the work queued on the stream."""
        with self._held("Stream.synchronize") as handle:
            check(_lib.load().pm_stream_synchronize(handle), "Stream.synchronize")

    def __cuda_stream__(self):
        return (0, self.handle)

    def close(self):
        """Waits for the stream's work, then destroys it. BufferError while a
        call in another thread (a copy on it, say) uses the stream."""
        handle = self._take_handle()
        if handle is not None:
            check(_lib.load().pm_stream_destroy(handle), "Stream.close")

    def __repr__(self):
        state = "closed" if self._handle is None else hex(self._handle)
        return f"<pinmem.Stream {state}>"


def _as_int(value, what):
    if isinstance(value, bool):
        raise TypeError(f"{what}: a stream handle is an int, not a bool")
    if isinstance(value, int):
        return value
    if isinstance(value, ctypes.c_void_p):
        return value.value or 0
    try:
        return int(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: cannot read a stream handle from {type(value).__name__}") from None


def stream_use(stream, what="stream"):
    """(handle, let_go): stream's handle as stream_handle() gives it, and
    for a pinmem.Stream, held against close() from another thread until
    the caller calls let_go (None for other streams)."""
    if isinstance(stream, Stream):
        return stream._hold(what), stream._let_go
    return stream_handle(stream, what), None


def stream_handle(stream, what="stream"):
    """The raw handle for stream, or None for None (a synchronous copy).

    Accepted: an int handle (0 or STREAM_LEGACY: the legacy default stream;
    STREAM_PER_THREAD: the calling thread's own), a pinmem.Stream,
    anything with ``__cuda_stream__`` (cuda.core, recent PyTorch and CuPy), a
    torch.cuda.Stream (``cuda_stream``), a CuPy stream (``ptr``) or a Numba
    stream (``handle``)."""
    if stream is None:
        return None
    if isinstance(stream, (int, bool)):
        handle = _as_int(stream, what)
    elif isinstance(stream, Stream):
        handle = stream.handle
    elif hasattr(stream, "__cuda_stream__"):
        proto = stream.__cuda_stream__()
        if not (isinstance(proto, tuple) and len(proto) == 2):
            raise TypeError(f"{what}: __cuda_stream__() must return (version, handle)")
        handle = _as_int(proto[1], what)
    elif hasattr(stream, "cuda_stream"):
        handle = _as_int(stream.cuda_stream, what)
    elif hasattr(stream, "ptr") and not callable(stream.ptr):
        handle = _as_int(stream.ptr, what)
    elif hasattr(stream, "handle"):
        handle = _as_int(stream.handle, what)
    else:
        raise TypeError(
            f"{what}: expected None, an int handle, a pinmem.Stream or a torch, CuPy, Numba or "
            f"cuda.core stream, not {type(stream).__name__}")
    if handle < 0 or handle >= 1 << 64:
        raise ValueError(f"{what}: {handle} is not a stream handle")
    return handle


def wait_for(waiting, other):
    """Makes work queued next on stream handle ``waiting`` (None or 0: the
    legacy default stream) wait for the work queued so far on ``other``."""
    lib = _lib.load()
    ev = ctypes.c_void_p()
    check(lib.pm_event_create(ctypes.byref(ev)), "stream order")
    try:
        check(lib.pm_event_record(ev, other), "stream order")
        check(lib.pm_stream_wait_event(waiting or None, ev), "stream order")
    finally:
        lib.pm_event_destroy(ev)
