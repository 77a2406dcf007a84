"""pinmem.copy_batch: scattered blocks between host and device memory both
ways, from lists and from arrays, on a stream; every kind of bad input
refused before anything moves."""

import mmap
import random

import pytest

import pinmem
from conftest import host_memory, optional, requires_cuda

BLOCK = 5000
COUNT = 40


def scattered(seed):
    """Block i of the host buffer to slot order[i] of the device buffer."""
    order = list(range(COUNT))
    random.Random(seed).shuffle(order)
    return order


def fill(buf, seed):
    data = random.Random(seed).randbytes(len(buf))
    buf[:] = data
    return data


def device_bytes(dev, n):
    out = bytearray(n)
    pinmem.copy(out, dev, n)
    return bytes(out)


@pytest.mark.parametrize("host_kind", ["pageable", "pinned"])
def test_round_trip_from_lists(host_kind):
    n = COUNT * BLOCK
    host, view = host_memory(host_kind, n)
    want = fill(view, 1)
    base = ctypes_address(host)
    order = scattered(2)
    with pinmem.device_empty(2 * n) as dev:
        dsts = [dev.ptr + 2 * order[i] * BLOCK for i in range(COUNT)]
        srcs = [base + i * BLOCK for i in range(COUNT)]
        pinmem.copy_batch(dsts, srcs, [BLOCK] * COUNT)
        on_device = device_bytes(dev, 2 * n)
        for i in range(COUNT):
            at = 2 * order[i] * BLOCK
            assert on_device[at:at + BLOCK] == want[i * BLOCK:(i + 1) * BLOCK]
        view[:] = bytes(n)
        pinmem.copy_batch(srcs, dsts, [BLOCK] * COUNT)  # and back
    assert bytes(view) == want
    view.release()  # a Buffer closes only once no view of it is alive
    if host_kind == "pinned":
        host.close()


def test_arrays_and_a_stream():
    np = optional("numpy")
    n = COUNT * BLOCK
    host = np.frombuffer(random.Random(3).randbytes(n), dtype=np.uint8).copy()
    back = np.zeros(n, dtype=np.uint8)
    order = scattered(4)
    with pinmem.device_empty(2 * n) as dev, pinmem.Stream() as s:
        dsts = np.array([dev.ptr + 2 * order[i] * BLOCK for i in range(COUNT)], dtype=np.uint64)
        srcs = np.arange(COUNT, dtype=np.int64) * BLOCK + host.ctypes.data
        sizes = np.full(COUNT, BLOCK, dtype=np.uint64)
        pinmem.copy_batch(dsts, srcs, sizes, stream=s)
        pinmem.copy_batch(srcs - host.ctypes.data + back.ctypes.data, dsts, sizes, stream=s)
        s.synchronize()
    assert (back == host).all()


@requires_cuda
def test_torch_kv_blocks_on_torch_stream():
    """A KV cache's way: blocks of a CUDA tensor to scattered blocks of a
    pinned CPU tensor and back, on PyTorch's stream, after work queued there."""
    torch = optional("torch")
    blocks, elems = 64, 16 << 10  # 64 KiB blocks of float32
    stride = elems * 4
    cache = torch.randn(2 * blocks, elems, device="cuda")
    host = torch.empty(blocks, elems, pin_memory=True)
    rows = [2 * r for r in random.Random(5).sample(range(blocks), blocks)]  # block i: rows[i]
    dev = [cache.data_ptr() + rows[i] * stride for i in range(blocks)]
    pinned = [host.data_ptr() + i * stride for i in range(blocks)]
    s = torch.cuda.current_stream()
    cache.mul_(2.0)  # queued before the batch on its stream: the batch must see it
    pinmem.copy_batch(pinned, dev, [stride] * blocks, stream=s)
    s.synchronize()
    assert torch.equal(host, cache[rows].cpu())
    back = torch.zeros_like(cache)
    pinmem.copy_batch([back.data_ptr() + r * stride for r in rows], pinned, [stride] * blocks,
                      stream=s)
    s.synchronize()
    assert torch.equal(back[rows], cache[rows])


def test_sizes_of_zero_and_an_empty_batch():
    with pinmem.device_empty(64) as dev:
        src = bytearray(b"x" * 64)
        pinmem.copy_batch([dev.ptr, 0], [ctypes_address(src), 0], [64, 0])  # 0 bytes: NULL is fine
        assert device_bytes(dev, 64) == bytes(src)
    pinmem.copy_batch([], [], [])


def test_bad_input_is_refused():
    np = optional("numpy")
    with pinmem.device_empty(2 * BLOCK) as dev:
        src = bytearray(BLOCK)
        s = ctypes_address(src)
        with pytest.raises(ValueError, match="differ in length"):
            pinmem.copy_batch([dev.ptr], [s, s], [BLOCK])
        with pytest.raises(TypeError, match=r"dsts\[0\] must be an int"):
            pinmem.copy_batch(["0x10"], [s], [BLOCK])
        with pytest.raises(TypeError, match=r"sizes\[1\] must be an int, not float"):
            pinmem.copy_batch([dev.ptr, dev.ptr + 64], [s, s + 64], [64, 1.5])
        with pytest.raises(ValueError, match="outside 0 to"):
            pinmem.copy_batch([dev.ptr], [s], [-1])
        with pytest.raises(TypeError, match=r"sizes\[1\] must be an int, not a bool"):
            pinmem.copy_batch([dev.ptr, dev.ptr + 64], [s, s + 64], [64, True])
        with pytest.raises(TypeError, match="sequence of ints or an array"):
            pinmem.copy_batch(dev.ptr, [s], [BLOCK])
        with pytest.raises(TypeError, match="contiguous one-dimensional"):
            pinmem.copy_batch(np.zeros((1, 1), dtype=np.uint64), [s], [BLOCK])
        with pytest.raises(TypeError, match="contiguous one-dimensional"):
            pinmem.copy_batch(np.zeros(1, dtype=np.float64), [s], [BLOCK])
        with pytest.raises(ValueError, match="negative"):
            pinmem.copy_batch([dev.ptr], [s], np.array([-5], dtype=np.int64))
        with pytest.raises(TypeError, match="stream"):
            pinmem.copy_batch([dev.ptr], [s], [BLOCK], stream="a stream")
        # overlapping destinations: the library's check, naming both elements
        with pytest.raises(pinmem.PinmemError) as e:
            pinmem.copy_batch([dev.ptr, dev.ptr + 10], [s, s], [100, 100])
        assert e.value.result == "PM_ERROR_INVALID_VALUE"
        assert "element 1" in e.value.detail and "element 0" in e.value.detail
        # an address nothing is mapped at: refused before anything moves, never a fault
        hole = mmap.mmap(-1, mmap.PAGESIZE)
        gone = ctypes_address(hole)
        hole.close()
        with pytest.raises(ValueError, match="element 1's source .* is not mapped"):
            pinmem.copy_batch([dev.ptr, dev.ptr + BLOCK], [s, gone], [BLOCK, 16])


def ctypes_address(obj):
    """The address of a writable buffer-protocol object's first byte."""
    import ctypes

    return ctypes.addressof(ctypes.c_char.from_buffer(obj))
