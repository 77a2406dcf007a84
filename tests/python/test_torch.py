"""pinmem.torch: to_host on CPU tensors here; to_device and CUDA tensors on a GPU."""

import pytest

from conftest import requires_cuda

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
