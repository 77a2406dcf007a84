"""pinmem.torch: to_host on CPU tensors here; to_device and CUDA tensors on a GPU."""

import pytest

from conftest import is_cuda, requires_cuda

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
pt = pytest.importorskip("pinmem.torch", reason="pinmem.torch does not import here")

import pinmem  # noqa: E402


def test_loaded_on_demand():
    assert pinmem.torch is pt


def test_to_host_of_cpu_tensors():
    t = torch.arange(1000, dtype=torch.float32).reshape(10, 100)
    u = pt.to_host(t)
    assert torch.equal(t, u) and u.data_ptr() != t.data_ptr()
    out = torch.empty(10, 100)
    assert pt.to_host(t, out=out) is out and torch.equal(out, t)
    nc = t.t()  # non-contiguous: made contiguous first, shape kept
    assert torch.equal(pt.to_host(nc), nc)
    assert pt.to_host(torch.empty(0)).numel() == 0


def test_to_host_into_pinned_memory():
    t = torch.randn(4096)
    with pinmem.empty(4096 * 4) as b:
        out = b.torch(torch.float32)
        pt.to_host(t, out=out)
        assert torch.equal(out, t)
        del out


def test_bad_arguments():
    t = torch.ones(4)
    with pytest.raises(TypeError):
        pt.to_host([1, 2, 3])
    with pytest.raises(ValueError, match="shape"):
        pt.to_host(t, out=torch.empty(5))
    with pytest.raises(ValueError):
        pt.to_host(t, out=torch.empty(4, dtype=torch.float64))
    with pytest.raises(TypeError):
        pt.to_host(t, out=bytearray(16))
    with pytest.raises(TypeError):
        pt.to_device("tensor")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            pt.to_device(t)


def test_to_host_refuses_an_out_it_cannot_fill_truly():
    t = torch.tensor([1 + 2j, 3 + 4j])
    with pytest.raises(ValueError, match="conj"):
        pt.to_host(t, out=torch.zeros(2, dtype=torch.complex64).conj())
    with pytest.raises(ValueError, match="neg"):
        pt.to_host(torch.ones(3), out=torch.zeros(3)._neg_view())
    with pytest.raises(ValueError, match="requires grad"):
        pt.to_host(torch.ones(3), out=torch.zeros(3, requires_grad=True))
    with pytest.raises(ValueError, match="quantized"):
        pt.to_host(torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.quint8))


def test_to_host_into_read_only_memory_raises(tmp_path):
    np = pytest.importorskip("numpy")
    path = tmp_path / "zeros"
    path.write_bytes(bytes(4096))
    read_only = np.memmap(path, dtype=np.uint8, mode="r")
    with pytest.warns(UserWarning):  # PyTorch's: it does not support non-writable tensors
        out = torch.from_numpy(read_only)
    with pytest.raises(ValueError, match="cannot be written"):
        pt.to_host(torch.ones(4096, dtype=torch.uint8), out=out)
    del out, read_only


def test_to_host_counts_as_an_in_place_change():
    # A value saved for backward and then overwritten must make backward
    # refuse, as torch's own in-place copy does, not give a wrong gradient.
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x.exp()
    version = y._version
    pt.to_host(torch.zeros(3), out=y.detach())
    assert y._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_to_device_checks_its_arguments_before_cuda():
    # These raise the same with or without CUDA: nothing is allocated first.
    t = torch.ones(4)
    with pytest.raises(TypeError, match="stream"):
        pt.to_device(t, stream="the side stream")
    with pytest.raises(TypeError, match="bool"):
        pt.to_device(t, stream=True)
    with pytest.raises(ValueError, match="stream handle"):
        pt.to_device(t, stream=-1)
    with pytest.raises(ValueError, match="stream handle"):
        pt.to_device(t, stream=1 << 64)
    with pytest.raises(ValueError, match="not a CUDA device"):
        pt.to_device(t, "cpu")
    with pytest.raises(ValueError, match="not a device"):
        pt.to_device(t, "gpu:0")
    with pytest.raises(ValueError, match="CPU tensors"):
        pt.to_device(torch.empty(4, device="meta"))


def test_to_device_lets_go_of_a_pinmem_stream():
    # Held against close() during the call, let go after it, failed or not.
    if torch.cuda.is_available() and not is_cuda():
        pytest.skip("pinmem's posix backend beside PyTorch's CUDA: no stream serves both")
    t = torch.ones(4)
    with pinmem.Stream() as s:
        if torch.cuda.is_available():
            pt.to_device(t, stream=s)
            s.synchronize()
        else:
            with pytest.raises(RuntimeError, match="CUDA"):
                pt.to_device(t, stream=s)
    assert s.closed


requires_torch_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                         reason="needs a CUDA build of PyTorch and a GPU")
requires_two_gpus = pytest.mark.skipif(not torch.cuda.is_available()
                                       or torch.cuda.device_count() < 2,
                                       reason="needs two GPUs")


@requires_cuda
def test_to_device_and_back():
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.uint8):
        t = (torch.rand(1 << 20) * 100).to(dtype).reshape(1024, 1024)
        d = pt.to_device(t)
        assert d.device.type == "cuda" and d.dtype == dtype and d.shape == t.shape
        assert torch.equal(d.cpu(), t)
        assert torch.equal(pt.to_host(d), t)


@requires_cuda
def test_to_device_on_a_side_stream():
    s = torch.cuda.Stream()
    t = torch.randn(1 << 22)
    d = pt.to_device(t, stream=s)
    s.synchronize()
    assert torch.equal(d.cpu(), t)


@requires_cuda
def test_to_device_holds_a_pinmem_stream(monkeypatch):
    # A close() from elsewhere while the copy is being queued is refused:
    # the stream would be destroyed under the copy.
    s = pinmem.Stream()
    refused = []
    allocate = torch.empty

    def allocate_then_close(*args, **kwargs):
        try:
            s.close()
        except BufferError:
            refused.append(True)
        return allocate(*args, **kwargs)

    t = torch.randn(1 << 20)
    monkeypatch.setattr(torch, "empty", allocate_then_close)
    d = pt.to_device(t, stream=s)
    monkeypatch.undo()
    s.synchronize()
    assert refused and not s.closed
    assert torch.equal(d.cpu(), t)
    s.close()


@requires_cuda
@pytest.mark.parametrize("kind", ["torch stream handle", "per-thread stream"])
def test_to_device_on_a_foreign_stream_keeps_torch_order(kind):
    # A block freed on torch's current stream while that stream's work still
    # writes it must not become the result of a copy queued on a stream
    # given as a handle: the copy would land first and the old work after.
    n = 1 << 22
    t = torch.randn(n)
    current, side = torch.cuda.Stream(), torch.cuda.Stream()
    handle = side.cuda_stream if kind == "torch stream handle" else pinmem.STREAM_PER_THREAD
    with torch.cuda.stream(current):
        x = torch.empty(n, device="cuda")
        torch.cuda._sleep(200_000_000)  # about 0.1 s of the stream's time
        x.fill_(7.0)
        del x  # back to the current stream's pool, its fill still queued
        d = pt.to_device(t, stream=handle)
    torch.cuda.synchronize()
    assert torch.equal(d.cpu(), t)


def _stream_as(kind, side):
    """side (a torch stream) as the stream= argument of a kind."""
    if kind == "torch stream":
        return side
    if kind == "external stream":
        return torch.cuda.ExternalStream(side.cuda_stream)
    if kind == "int handle":
        return side.cuda_stream
    return getattr(pinmem, kind)  # STREAM_LEGACY, STREAM_PER_THREAD


STREAM_KINDS = ["torch stream", "external stream", "int handle", "STREAM_LEGACY",
                "STREAM_PER_THREAD"]


@requires_cuda
@requires_torch_cuda
@pytest.mark.parametrize("kind", STREAM_KINDS + ["0", "pinmem.Stream"])
def test_to_device_on_every_kind_of_stream(kind):
    t = torch.randn(1 << 20)
    if kind == "0":
        d = pt.to_device(t, stream=0)
    elif kind == "pinmem.Stream":
        with pinmem.Stream() as s:
            d = pt.to_device(t, stream=s)
            s.synchronize()
    else:
        side = torch.cuda.Stream()
        d = pt.to_device(t, stream=_stream_as(kind, side))
    torch.cuda.synchronize()
    assert d.device.type == "cuda" and torch.equal(d.cpu(), t)


@requires_cuda
@requires_torch_cuda
@pytest.mark.parametrize("kind", STREAM_KINDS)
def test_to_device_result_dropped_at_once_is_not_reused_under_the_copy(kind):
    # The result's block must belong to the stream that writes it: were it
    # the current stream's, freeing it would let the next allocation there
    # take it while the copy, queued behind the side stream's work, still
    # had to write it.
    n = 1 << 22
    t = torch.randn(n)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # about 0.1 s of the side stream's time
    stream = _stream_as(kind, side)
    if kind in ("STREAM_LEGACY", "STREAM_PER_THREAD"):
        # these streams wait for no torch side stream: make them
        pinmem._stream.wait_for(stream, side.cuda_stream)
    d = pt.to_device(t, stream=stream)
    del d
    x = torch.full((n,), 7.0, device="cuda")
    torch.cuda.synchronize()
    assert torch.equal(x, torch.full((n,), 7.0, device="cuda"))


@requires_cuda
@requires_torch_cuda
@pytest.mark.parametrize("kind", ["torch stream", "int handle", "STREAM_PER_THREAD"])
def test_to_device_keeps_a_pinned_source_until_copied(kind):
    # PyTorch's own non-blocking copy records the use with its pinned-memory
    # cache; without that a source dropped at once would be handed out again
    # (and overwritten) while the copy still had to read it.
    n = 1 << 20
    src = torch.randn(n).pin_memory()
    expected = src.clone()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
    stream = _stream_as(kind, side)
    if kind == "STREAM_PER_THREAD":
        pinmem._stream.wait_for(stream, side.cuda_stream)
    d = pt.to_device(src, stream=stream)
    del src
    again = torch.empty(n).pin_memory()  # the freed block, were it free
    again.fill_(7.0)
    torch.cuda.synchronize()
    assert torch.equal(d.cpu(), expected)
    pt.to_device(torch.ones(1))  # lets go of sources whose copies are done
    torch.cuda.synchronize()
    assert not pt._held


@requires_cuda
@requires_torch_cuda
def test_to_device_refuses_a_stream_of_another_device():
    s = torch.cuda.Stream()
    other = (s.device.index + 1) % 8
    with pytest.raises(ValueError, match="stream is on"):
        pt.to_device(torch.ones(4), f"cuda:{other}", stream=s)


@requires_cuda
@requires_two_gpus
def test_to_device_on_another_devices_stream():
    t = torch.randn(1 << 20)
    with torch.cuda.device(0):
        s = torch.cuda.Stream(device=1)
        d = pt.to_device(t, stream=s)  # on the stream's device, from its pool
        assert d.device == torch.device("cuda", 1)
        s.synchronize()
        assert torch.equal(d.cpu(), t)


@requires_cuda
@requires_two_gpus
def test_to_host_of_another_device_waits_for_its_stream():
    # Copied on the tensor's device's current stream: on another device's
    # legacy stream the copy would not wait for the fill.
    n = 1 << 22
    with torch.cuda.device(1):
        x = torch.empty(n, device="cuda:1")
        torch.cuda._sleep(200_000_000)
        x.fill_(3.0)
    with torch.cuda.device(0):
        u = pt.to_host(x)
    assert torch.equal(u, torch.full((n,), 3.0))


@requires_cuda
def test_copy_with_cuda_tensors():
    t = torch.randn(1 << 20)
    d = torch.empty_like(t, device="cuda")
    pinmem.copy(d, t)
    assert torch.equal(d.cpu(), t)
    back = torch.empty_like(t)
    pinmem.copy(back, d, stream=torch.cuda.current_stream())
    assert torch.equal(back, t)
    d2 = torch.empty_like(d)
    pinmem.copy(d2, d)  # device to device
    torch.cuda.synchronize()
    assert torch.equal(d2, d)
    pinmem.copy(d2.data_ptr(), t)  # an int device address
    torch.cuda.synchronize()
    assert torch.equal(d2.cpu(), t)


@requires_cuda
def test_pinned_torch_tensor_and_registration():
    t = torch.randn(1 << 20).pin_memory()  # pinned by the driver, not pinmem
    d = torch.empty_like(t, device="cuda")
    pinmem.copy(d, t)
    assert torch.equal(d.cpu(), t)
    u = torch.randn(1 << 20)
    with pinmem.register(u):
        pinmem.copy(d, u, stream=torch.cuda.current_stream())
        torch.cuda.synchronize()
    assert torch.equal(d.cpu(), u)
