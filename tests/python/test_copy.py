"""pinmem.copy: every kind of object on either side, sizes, streams."""

import gc
import os
import random
import threading

import pytest

import pinmem
from conftest import memlock_headroom, optional, skip_unless_pools_fit


def fill(obj, seed):
    data = random.Random(seed).randbytes(len(memoryview(obj).cast("B")))
    memoryview(obj).cast("B")[:] = data
    return data


def readback(dev, n):
    out = bytearray(n)
    pinmem.copy(out, dev, n)
    return bytes(out)


@pytest.mark.parametrize("n", [1, 2, 3, 4095, 4096, 4097, 65536 + 7, (1 << 20) + 3, 3 << 20])
def test_round_trip_bytearray(n):
    src = bytearray(n)
    want = fill(src, n)
    with pinmem.device_empty(n) as dev:
        assert pinmem.copy(dev, src) is dev
        assert readback(dev, n) == want


def test_buffer_pool_and_registration_sources():
    skip_unless_pools_fit()
    n = 1 << 18
    with pinmem.device_empty(n) as dev, pinmem.empty(n) as b, pinmem.Pool() as pool:
        want = fill(b, 1)
        pinmem.copy(dev, b)
        assert readback(dev, n) == want
        p = pool.alloc(n)
        pinmem.copy(p, dev)  # device to pool memory
        assert bytes(p[:]) == want
        data = bytearray(n)
        with pinmem.register(data) as r:
            pinmem.copy(r, p)  # host to host
        assert data == want
        p.close()


def test_numpy_both_ways():
    np = optional("numpy")
    a = np.random.default_rng(0).integers(0, 1 << 30, size=(256, 33), dtype=np.int64)
    out = np.zeros_like(a)
    with pinmem.device_empty(a.nbytes) as dev:
        pinmem.copy(dev, a)
        pinmem.copy(out, dev)
    assert (out == a).all()


def test_torch_cpu_tensors():
    torch = optional("torch")
    t = torch.arange(10000, dtype=torch.float64)
    u = torch.empty_like(t)
    with pinmem.device_empty(t.numel() * 8) as dev:
        pinmem.copy(dev, t)
        pinmem.copy(u, dev)
    assert torch.equal(t, u)
    half = torch.empty(5000, dtype=torch.float64)
    pinmem.copy(half, t, 5000 * 8)
    assert torch.equal(half, t[:5000])


def test_int_addresses_need_a_size():
    src = bytearray(b"abcdefgh")
    dst = bytearray(8)
    with pinmem.empty(8) as b, pinmem.device_empty(8) as dev:
        pinmem.copy(dev.ptr, src)  # the size comes from the other side
        pinmem.copy(b.ptr, dev.ptr, 8)
        pinmem.copy(dst, b.ptr)
        with pytest.raises(ValueError, match="give nbytes"):
            pinmem.copy(b.ptr, dev.ptr)
    assert dst == src


def test_partial_and_size_checks():
    src = bytearray(range(100))
    dst = bytearray(50)
    with pytest.raises(ValueError, match="sizes differ"):
        pinmem.copy(dst, src)
    pinmem.copy(dst, src, 50)
    assert dst == src[:50]
    with pytest.raises(ValueError, match="do not fit"):
        pinmem.copy(dst, src, 60)
    with pytest.raises(ValueError, match="negative"):
        pinmem.copy(dst, src, -1)
    with pytest.raises(TypeError):
        pinmem.copy(dst, src, 1.5)
    pinmem.copy(dst, src, 0)  # nothing to do


def test_streams():
    n = 1 << 20
    src = bytearray(n)
    want = fill(src, 7)
    out = bytearray(n)
    with pinmem.Stream() as s, pinmem.device_empty(n) as dev:
        pinmem.copy(dev, src, stream=s)
        src[:] = bytes(n)  # a pageable source may be reused once copy returns
        pinmem.copy(out, dev, stream=s.handle)  # pageable destination: done on return
        assert bytes(out) == want
        with pinmem.empty(n) as pinned:
            pinmem.copy(pinned, dev, stream=s)
            s.synchronize()
            assert bytes(pinned[:]) == want
        pinmem.copy(out, dev, stream=0)  # 0: the default stream, asynchronously
    assert bytes(out) == want


def test_named_stream_handles():
    n = 1 << 20
    src = bytearray(n)
    want = fill(src, 9)
    out = bytearray(n)
    with pinmem.device_empty(n) as dev:
        for handle in (pinmem.STREAM_LEGACY, pinmem.STREAM_PER_THREAD):
            pinmem.copy(dev, src, stream=handle)
            pinmem.copy(out, dev, stream=handle)  # pageable destination: done on return
            assert bytes(out) == want
            out[:] = bytes(n)


def test_foreign_stream_objects():
    class CudaStreamProtocol:
        def __init__(self, handle):
            self.handle_ = handle

        def __cuda_stream__(self):
            return (0, self.handle_)

    class TorchLike:
        def __init__(self, handle):
            self.cuda_stream = handle

    n = 4096
    src, out = bytearray(b"z" * n), bytearray(n)
    with pinmem.Stream() as s, pinmem.device_empty(n) as dev:
        pinmem.copy(dev, src, stream=CudaStreamProtocol(s.handle))
        pinmem.copy(out, dev, stream=TorchLike(s.handle))
    assert out == src
    with pytest.raises(TypeError, match="stream"):
        pinmem.copy(out, src, stream="fast")
    with pytest.raises(TypeError):
        pinmem.copy(out, src, stream=True)
    with pytest.raises(ValueError):
        pinmem.copy(out, src, stream=-5)


def test_threads():
    errors = []

    def worker(seed):
        try:
            rng = random.Random(seed)
            with pinmem.Stream() as s:
                for _ in range(20):
                    n = rng.randint(1, 300000)
                    src = bytearray(rng.randbytes(n))
                    with pinmem.device_empty(n) as dev:
                        pinmem.copy(dev, src, stream=s if rng.random() < 0.5 else None)
                        out = bytearray(n)
                        pinmem.copy(out, dev, stream=s if rng.random() < 0.5 else None)
                        if out != src:
                            errors.append(f"thread {seed}: {n} bytes differ")
        except Exception as e:  # report, do not hang the test
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_large_pageable_copy():
    n = 64 << 20
    np = optional("numpy")
    src = np.random.default_rng(3).integers(0, 255, size=n, dtype=np.uint8)
    out = np.zeros(n, dtype=np.uint8)
    with pinmem.device_empty(n) as dev:
        pinmem.copy(dev, src)
        pinmem.copy(out, dev)
    assert (out == src).all()
    del src, out
    gc.collect()


def test_stats_count_copies():
    before = pinmem.stats()["copy"]
    n = 3 << 20
    with pinmem.device_empty(n) as dev:
        pinmem.copy(dev, bytearray(n))
    after = pinmem.stats()["copy"]
    moved = sum(after[k] - before[k] for k in ("direct_bytes", "staged_bytes", "driver_bytes",
                                                "cached_bytes"))
    assert moved == n
    assert set(pinmem.stats()) == {"copy", "pools"}


@pytest.mark.skipif(memlock_headroom() is not None and memlock_headroom() < (32 << 20),
                    reason="16 MiB of pinned memory is past this user's memlock limit")
def test_large_pinned_copy():
    n = 16 << 20
    with pinmem.empty(n) as b, pinmem.device_empty(n) as dev:
        want = fill(b, 11)
        pinmem.copy(dev, b)
        assert readback(dev, n) == want
    assert os.environ is not None


def test_dlpack_producers():
    torch = optional("torch")

    class OnlyDLPack:
        """A producer known only through DLPack (as JAX arrays are)."""

        def __init__(self, t):
            self.t = t

        def __dlpack__(self, stream=None):
            return self.t.__dlpack__()

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    src = torch.arange(5000, dtype=torch.int32)
    out = torch.zeros(5000, dtype=torch.int32)
    with pinmem.device_empty(20000) as dev:
        pinmem.copy(dev, OnlyDLPack(src))
        pinmem.copy(OnlyDLPack(out), dev)
    assert torch.equal(out, src)
    with pytest.raises(ValueError, match="contiguous"):
        pinmem.copy(bytearray(8), OnlyDLPack(torch.zeros(4, 4).t()[::2]))
