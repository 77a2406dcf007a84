"""pinmem.torch: PyTorch tensors copied through pinmem's copy engine, and
PyTorch's pinned memory served by pinmem.

to_device(t) is t.to("cuda") and to_host(t) is t.cpu(), with pageable
memory moved by pinmem's staging engine instead of the driver's own
pageable path; dtype and shape are kept.

install() replaces PyTorch's CUDA host allocator (PyTorch 2.11 and later) with
one served by a pinmem pool (pinmem.torch_host); uninstall() puts PyTorch's
back.
"""

try:
    import torch as _torch
except ImportError as e:  # pragma: no cover - depends on the machine
    raise ImportError(f"pinmem.torch needs PyTorch, which does not import here: {e}") from e

from . import _lib
from ._errors import check
from ._stream import STREAM_LEGACY, STREAM_PER_THREAD, stream_handle, wait_for

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
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t if t.is_contiguous() else t.contiguous()


def _nbytes(t):
    return t.numel() * t.element_size()


def to_device(t, device=None, *, stream=None):
    """A CUDA copy of the CPU tensor t on device (default: the current CUDA
    device), queued on stream (default: that device's current torch
    stream). As with t.to("cuda"): a pageable t may be changed as soon as
    this returns; a page-locked t must stay unchanged until the stream has
    done the copy (as with non_blocking=True).

    The result is allocated on the stream the copy is queued on (a stream
    that is not torch's is wrapped in torch.cuda.ExternalStream, and must
    outlive the copy), so PyTorch's caching allocator orders the reuse of
    its memory after the copy, as for any tensor made under
    torch.cuda.stream(stream): to use it on another stream, make that
    stream wait for this one, and call record_stream when it is freed
    there first."""
    t = _tensor(t, "pinmem.torch.to_device")
    if t.device.type != "cpu":
        raise ValueError(f"pinmem.torch.to_device copies CPU tensors; this one is on {t.device}")
    if not _torch.cuda.is_available():
        raise RuntimeError("pinmem.torch.to_device needs CUDA, and torch.cuda is not available "
                           "here")
    device = _torch.device("cuda", _torch.cuda.current_device()) if device is None \
        else _torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"pinmem.torch.to_device: {device} is not a CUDA device")
    if device.index is None:
        device = _torch.device("cuda", _torch.cuda.current_device())
    torch_stream = stream if isinstance(stream, _torch.cuda.Stream) else None
    if stream is None:
        torch_stream = _torch.cuda.current_stream(device)
    handle = stream_handle(torch_stream if torch_stream is not None else stream,
                           "pinmem.torch.to_device: stream")
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
            check(_lib.load().pm_memcpy_async(out.data_ptr(), t.data_ptr(), n, handle or None),
                  "pinmem.torch.to_device")
            if fence is not None:
                wait_for(fence.cuda_stream, handle)
    return out


def to_host(t, *, out=None):
    """A CPU copy of t (t.cpu()): into out when given (a contiguous CPU tensor
    of t's shape and dtype, page-locked or not), else into a new pageable
    tensor. Ordered after the work on t's device's current stream, and done
    when this returns."""
    t = _tensor(t, "pinmem.torch.to_host")
    if out is None:
        out = _torch.empty(t.shape, dtype=t.dtype, device="cpu")
    else:
        if not isinstance(out, _torch.Tensor):
            raise TypeError(f"pinmem.torch.to_host: out must be a torch.Tensor, not {type(out).__name__}")
        if out.device.type != "cpu":
            raise ValueError(f"pinmem.torch.to_host: out must be a CPU tensor, not on {out.device}")
        if out.dtype != t.dtype or out.shape != t.shape:
            raise ValueError(f"pinmem.torch.to_host: out has dtype {out.dtype} and shape "
                             f"{tuple(out.shape)}, the tensor {t.dtype} and {tuple(t.shape)}")
        if not out.is_contiguous():
            raise ValueError("pinmem.torch.to_host: out is not contiguous")
    n = _nbytes(t)
    if n == 0:
        return out
    lib = _lib.load()
    if t.device.type == "cpu":
        check(lib.pm_memcpy(out.data_ptr(), t.data_ptr(), n), "pinmem.torch.to_host")
        return out
    if t.device.type != "cuda":
        raise ValueError(f"pinmem.torch.to_host: tensors on {t.device.type} are not supported")
    s = _torch.cuda.current_stream(t.device)
    handle = s.cuda_stream
    check(lib.pm_memcpy_async(out.data_ptr(), t.data_ptr(), n, handle or None),
          "pinmem.torch.to_host")
    # into page-locked memory the copy runs in stream order: wait, as t.cpu() does
    check(lib.pm_stream_synchronize(handle or None), "pinmem.torch.to_host")
    return out
