"""End-to-end checks on a GPU (skipped elsewhere): bytes equal after every
copy; a pageable source overwritten right after copy() returns still
arrives as it was; a device-to-host copy queued after GPU work sees its
results; a graph capture of a pageable copy raises as PyTorch's own does."""

import pytest

from conftest import requires_cuda

torch = pytest.importorskip("torch", reason="PyTorch is not installed here")
pytestmark = requires_cuda

import pinmem  # noqa: E402

SIZES = [1, 4095, 1 << 20, (16 << 20) + 3, 256 << 20]


@pytest.mark.parametrize("n", SIZES)
def test_bytes_equal_every_way(n):
    g = torch.Generator().manual_seed(n)
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    d = torch.empty(n, dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()
    for stream in (None, s):
        d.zero_()
        if stream is not None:  # s does not wait for the default stream by itself
            stream.wait_stream(torch.cuda.current_stream())
        pinmem.copy(d, src, stream=stream)
        back = torch.zeros(n, dtype=torch.uint8)
        pinmem.copy(back, d, stream=stream)
        assert torch.equal(back, src)
        with pinmem.empty(n) as b:
            pinmem.copy(b, d, stream=stream)
            if stream is not None:
                stream.synchronize()
            assert torch.equal(b.torch(), src)
            d.zero_()
            torch.cuda.synchronize()
            pinmem.copy(d, b, stream=stream)
            torch.cuda.synchronize()
            assert torch.equal(d.cpu(), src)
            del b  # the views above are gone


def test_pageable_source_overwritten_after_return():
    n = 256 << 20
    src = torch.full((n,), 7, dtype=torch.uint8)
    d = torch.empty(n, dtype=torch.uint8, device="cuda")
    s = torch.cuda.Stream()
    pinmem.copy(d, src, stream=s)
    src.fill_(9)  # allowed as soon as copy returns
    s.synchronize()
    assert bool((d == 7).all())


def test_dtoh_after_gpu_work_sees_its_results():
    n = 64 << 20
    d = torch.zeros(n // 4, dtype=torch.float32, device="cuda")
    s = torch.cuda.current_stream()
    torch.cuda._sleep(50_000_000)  # a long kernel ahead of the work below
    d.add_(3.0)
    out = torch.empty(n // 4, dtype=torch.float32)
    pinmem.copy(out, d, stream=s)  # pageable destination: done when this returns
    assert bool((out == 3.0).all())
    d.add_(1.0)
    out2 = torch.empty_like(out)
    pinmem.copy(out2, d)  # synchronous: the legacy default stream is torch's default
    assert bool((out2 == 4.0).all())


def _capture_error(copy_fn):
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            copy_fn()
    except Exception as e:
        return e
    return None


def test_graph_capture_of_a_pageable_copy_raises_like_torch():
    n = 1 << 20
    src = torch.ones(n, dtype=torch.uint8)
    d = torch.zeros(n, dtype=torch.uint8, device="cuda")
    theirs = _capture_error(lambda: d.copy_(src, non_blocking=True))
    torch.cuda.synchronize()
    ours = _capture_error(lambda: pinmem.copy(d, src, stream=torch.cuda.current_stream()))
    torch.cuda.synchronize()
    assert (theirs is None) == (ours is None), (theirs, ours)
    if ours is not None:
        assert isinstance(ours, pinmem.PinmemError), ours
        assert ours.result == "PM_ERROR_STREAM_CAPTURE_UNSUPPORTED", ours
        assert "page-locked" in ours.detail, ours.detail
    # nothing was corrupted: the device buffer still holds what it held
    assert bool((d == 0).all()) or bool((d == 1).all())


def test_graph_capture_of_a_torch_pinned_copy_replays():
    n = 1 << 20
    host = torch.full((n,), 5, dtype=torch.uint8).pin_memory()  # pinned by the driver
    d = torch.zeros(n, dtype=torch.uint8, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        pinmem.copy(d, host, stream=torch.cuda.current_stream())
    host.fill_(6)
    g.replay()
    torch.cuda.synchronize()
    assert bool((d == 6).all())


def test_graph_capture_of_a_pinned_copy_replays():
    n = 1 << 20
    with pinmem.empty(n) as b:
        host = b.torch()
        host.fill_(5)
        d = torch.zeros(n, dtype=torch.uint8, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            pinmem.copy(d, b, stream=torch.cuda.current_stream())
        host.fill_(6)
        g.replay()
        torch.cuda.synchronize()
        assert bool((d == 6).all())
        del host
