"""pinmem.torch: PyTorch tensors copied through pinmem's copy engine, and
PyTorch's pinned memory served by pinmem.

to_device(t) is t.to("cuda") and to_host(t) is t.cpu(), with pageable
memory moved by pinmem's staging engine instead of the driver's own
pageable path; dtype and shape are kept, and the result is detached from
autograd (as t.detach().cpu()).

install() replaces PyTorch's CUDA host allocator (PyTorch 2.11 and later) with
one served by a pinmem pool (pinmem.torch_host); uninstall() puts PyTorch's
back.
"""

import collections
import threading

try:
    import torch as _torch
except ImportError as e:  # pragma: no cover - depends on the machine
    raise ImportError(f"pinmem.torch needs PyTorch, which does not import here: {e}") from e

from . import _lib
from ._errors import check
from ._resolve import access_problem
from ._stream import STREAM_LEGACY, STREAM_PER_THREAD, stream_use, wait_for

__all__ = ["to_device", "to_host", "install", "uninstall", "installed"]


def install(pool=None):
    """PyTorch's CUDA host allocator served by pinmem (see pinmem.torch_host.install)."""
    from .torch_host import install as _install

    return _install(pool)


def uninstall():
    """Puts PyTorch's own CUDA host allocator back (pinmem.torch_host.uninstall)."""
    from .torch_host import uninstall as _uninstall

    _uninstall()


def installed():
    """Whether PyTorch's CUDA host allocator is pinmem's now."""
    from .torch_host import installed as _installed

    return _installed()


def _tensor(t, what):
    if not isinstance(t, _torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, not {type(t).__name__}")
    if t.layout != _torch.strided:
        raise ValueError(f"{what}: only strided (dense) tensors can be copied")
    if t.is_quantized or getattr(t, "is_nested", False):
        kind = "quantized" if t.is_quantized else "nested"
        raise ValueError(f"{what}: {kind} tensors cannot be copied as bytes")
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t if t.is_contiguous() else t.contiguous()


def _nbytes(t):
    return t.numel() * t.element_size()


# Page-locked sources of copies still queued, each behind an event recorded
# after its copy: PyTorch's pinned-memory cache hands a freed block out again
# at once unless its own copy recorded the use, which Python cannot do.
_held = collections.deque()
_held_lock = threading.Lock()


def _hold(t, stream):
    """Keeps t alive until the work queued so far on torch stream stream is done."""
    event = _torch.cuda.Event()
    event.record(stream)
    with _held_lock:
        _held.append((event, t))


def _release_done():
    """Lets go of the held sources whose copies are done (oldest first)."""
    done = []
    with _held_lock:
        while _held and _held[0][0].query():
            done.append(_held.popleft())
    del done  # the tensors go here, outside the lock


def _cuda_device(device, what):
    try:
        device = _torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{what}: {device!r} is not a device: {e}") from None
    if device.type != "cuda":
        raise ValueError(f"{what}: {device} is not a CUDA device")
    return device


def to_device(t, device=None, *, stream=None):
    """A CUDA copy of the CPU tensor t on device (default: stream's device
    for a torch stream, else the current CUDA device), queued on stream
    (default: that device's current torch stream). As with t.to("cuda"): a
    pageable t may be changed as soon as this returns; a page-locked t must
    stay unchanged until the stream has done the copy (as with
    non_blocking=True), and pinmem keeps it alive until then.

    The result is allocated on the stream the copy is queued on (a stream
    that is not torch's is wrapped in torch.cuda.ExternalStream, and must
    outlive the copy), as t.to(device, non_blocking=True) allocates and
    copies on the current stream inside torch.cuda.stream(stream): PyTorch's
    caching allocator then reuses its memory only in that stream's order. To
    use it on another stream, make that stream wait for this one, and call
    record_stream when it is freed there first. Only the per-thread default
    stream (STREAM_PER_THREAD), which no torch stream stands for, differs:
    the result comes from torch's current stream, which waits for the copy."""
    what = "pinmem.torch.to_device"
    t = _tensor(t, what)
    if t.device.type != "cpu":
        raise ValueError(f"{what} copies CPU tensors; this one is on {t.device}")
    if device is not None:
        device = _cuda_device(device, what)
    torch_stream = stream if isinstance(stream, _torch.cuda.Stream) else None
    handle, let_go = None, None
    if stream is not None and torch_stream is None:
        handle, let_go = stream_use(stream, f"{what}: stream")
    try:
        return _to_device(t, device, stream, torch_stream, handle, what)
    finally:
        if let_go is not None:
            let_go()


def _to_device(t, device, stream, torch_stream, handle, what):
    if not _torch.cuda.is_available():
        raise RuntimeError(f"{what} needs CUDA, and torch.cuda is not available here")
    _release_done()
    if device is None and torch_stream is not None:
        device = torch_stream.device
    elif device is None or device.index is None:
        device = _torch.device("cuda", _torch.cuda.current_device())
    if torch_stream is not None and torch_stream.device != device:
        # the allocation would come from device's current stream, not this one
        raise ValueError(f"{what}: the stream is on {torch_stream.device}, not on {device}")
    if stream is None:
        torch_stream = _torch.cuda.current_stream(device)
    if torch_stream is not None:
        handle = torch_stream.cuda_stream
    fence = None
    if torch_stream is None:
        # A block from torch's current stream's pool could still be in use
        # there, unordered with the copy: allocate on the copy's stream.
        if handle in (0, STREAM_LEGACY):  # the legacy default stream: torch's default
            torch_stream = _torch.cuda.default_stream(device)
        elif handle == STREAM_PER_THREAD:  # no torch stream stands for it
            fence = _torch.cuda.current_stream(device)
        else:
            torch_stream = _torch.cuda.ExternalStream(handle, device=device)
    with _torch.cuda.device(device):
        n = _nbytes(t)
        if fence is not None:
            # On torch's current stream, ordered both ways with the copy.
            out = _torch.empty(t.shape, dtype=t.dtype, device=device)
            if n:
                wait_for(handle, fence.cuda_stream)
        else:
            with _torch.cuda.stream(torch_stream):
                out = _torch.empty(t.shape, dtype=t.dtype, device=device)
        if n:
            try:
                check(_lib.load().pm_memcpy_async(out.data_ptr(), t.data_ptr(), n, handle or None),
                      what)
            finally:
                # even after a failure part of the copy may be queued
                if fence is not None:
                    wait_for(fence.cuda_stream, handle)
                if t.is_pinned():
                    _hold(t, fence if fence is not None else torch_stream)
    return out


def to_host(t, *, out=None):
    """A CPU copy of t (t.cpu()): into out when given (a contiguous CPU tensor
    of t's shape and dtype, page-locked or not), else into a new pageable
    tensor. As t.cpu() does, t is read on its device's current stream, after
    the work queued there, and the copy is done when this returns, so
    neither side needs to be recorded with any stream. The copy into out
    counts as an in-place change of it for autograd; out must not require
    grad, and must be writable memory."""
    what = "pinmem.torch.to_host"
    t = _tensor(t, what)
    given = out is not None
    if out is None:
        out = _torch.empty(t.shape, dtype=t.dtype, device="cpu")
    else:
        if not isinstance(out, _torch.Tensor):
            raise TypeError(f"{what}: out must be a torch.Tensor, not {type(out).__name__}")
        if out.device.type != "cpu":
            raise ValueError(f"{what}: out must be a CPU tensor, not on {out.device}")
        if out.dtype != t.dtype or out.shape != t.shape:
            raise ValueError(f"{what}: out has dtype {out.dtype} and shape "
                             f"{tuple(out.shape)}, the tensor {t.dtype} and {tuple(t.shape)}")
        if not out.is_contiguous():
            raise ValueError(f"{what}: out is not contiguous")
        # as torch's out= arguments: autograd cannot follow a raw write
        if out.requires_grad:
            raise ValueError(f"{what}: out requires grad; autograd cannot follow a copy into it")
        for bit in ("conj", "neg"):
            if getattr(out, f"is_{bit}", lambda: False)():
                raise ValueError(f"{what}: out has a lazy {bit} bit; its bytes would read "
                                 f"{'conjugated' if bit == 'conj' else 'negated'}")
    n = _nbytes(t)
    if n == 0:
        return out
    if given:
        # PyTorch lets a tensor view read-only memory (from_numpy of a read-only
        # memmap): the copy would fault instead of raising.
        problem = access_problem(out.data_ptr(), n, True, what=what)
        if problem is not None:
            raise ValueError(f"{what}: out cannot be written: {problem}")
    _to_host(t, out, n, what)
    if given:
        _mark_written(out)
    return out


def _mark_written(t):
    """Bumps t's version counter, as an in-place op does, so that autograd
    refuses a backward through values saved before the copy changed them."""
    increment = getattr(getattr(_torch.autograd, "graph", None), "increment_version", None)
    if increment is not None:
        increment(t)
        return
    with _torch.no_grad():  # PyTorch before 2.1: an in-place op on no element bumps it
        t.view(-1)[:0].zero_()


def _to_host(t, out, n, what):
    lib = _lib.load()
    if t.device.type == "cpu":
        check(lib.pm_memcpy(out.data_ptr(), t.data_ptr(), n), what)
        return
    if t.device.type != "cuda":
        raise ValueError(f"{what}: tensors on {t.device.type} are not supported")
    _release_done()
    # On t's device: the legacy default stream (handle 0) is that of the
    # current device's context, which another device's work does not order.
    with _torch.cuda.device(t.device):
        handle = _torch.cuda.current_stream(t.device).cuda_stream
        check(lib.pm_memcpy_async(out.data_ptr(), t.data_ptr(), n, handle or None), what)
        # into page-locked memory the copy runs in stream order: wait, as t.cpu() does
        check(lib.pm_stream_synchronize(handle or None), what)
