"""pinmem.copy_blocks: blocks by index between host and device memory both
ways, the mapping as an array, a tensor or pairs (with numpy and without),
on a stream; every kind of bad input refused before anything moves."""

import random
import sys

import pytest

import pinmem
from conftest import host_memory, optional, requires_cuda

BLOCK = 3000
BLOCKS = 24


def randbytes(n, seed):
    return random.Random(seed).randbytes(n)


def device_bytes(dev, n):
    out = bytearray(n)
    pinmem.copy(out, dev, n)
    return bytes(out)


def pairs(seed, count=BLOCKS):
    """count pairs (source block, destination block): distinct destinations
    in a device area twice the host's."""
    rng = random.Random(seed)
    return list(zip(rng.sample(range(BLOCKS), count), rng.sample(range(2 * BLOCKS), count)))


def expect_blocks(dev_bytes, host_bytes, mapping):
    for s, d in mapping:
        assert dev_bytes[d * BLOCK:(d + 1) * BLOCK] == host_bytes[s * BLOCK:(s + 1) * BLOCK]


@pytest.fixture(params=["numpy", "python"])
def mapping_path(request, monkeypatch):
    """Each test runs with numpy doing the arithmetic and with the pure
    Python pass that serves where numpy is missing."""
    if request.param == "numpy":
        optional("numpy")
    else:
        monkeypatch.setitem(sys.modules, "numpy", None)  # "import numpy" raises
    return request.param


@pytest.mark.parametrize("host_kind", ["pageable", "pinned"])
def test_round_trip(host_kind, mapping_path):
    n = BLOCKS * BLOCK
    host, view = host_memory(host_kind, n)
    want = randbytes(n, 1)
    view[:] = want
    mapping = pairs(2)
    with pinmem.device_empty(2 * n) as dev:
        pinmem.copy_blocks(dev, host, mapping, BLOCK)
        expect_blocks(device_bytes(dev, 2 * n), want, mapping)
        view[:] = bytes(n)
        pinmem.copy_blocks(host, dev, [(d, s) for s, d in mapping], BLOCK)  # and back
    assert bytes(view) == want
    view.release()
    if host_kind == "pinned":
        host.close()


def test_some_blocks_only_and_an_empty_mapping(mapping_path):
    n = BLOCKS * BLOCK
    src = bytearray(randbytes(n, 3))
    with pinmem.device_empty(2 * n) as dev:
        pinmem.copy(dev, bytes(2 * n))
        mapping = pairs(4, count=5)
        pinmem.copy_blocks(dev, src, mapping, BLOCK)
        got = device_bytes(dev, 2 * n)
        expect_blocks(got, src, mapping)
        untouched = set(range(2 * BLOCKS)) - {d for _, d in mapping}
        assert all(got[d * BLOCK:(d + 1) * BLOCK] == bytes(BLOCK) for d in untouched)
        assert pinmem.copy_blocks(dev, src, [], BLOCK) is dev


def test_numpy_mapping_and_a_stream():
    np = optional("numpy")
    n = BLOCKS * BLOCK
    host = np.frombuffer(randbytes(n, 5), dtype=np.uint8).copy()
    back = np.zeros_like(host)
    mapping = np.array(pairs(6), dtype=np.int32)
    with pinmem.device_empty(2 * n) as dev, pinmem.Stream() as s:
        pinmem.copy_blocks(dev, host, mapping, BLOCK, stream=s)
        pinmem.copy_blocks(back, dev, mapping[:, ::-1], BLOCK, stream=s)
        s.synchronize()
    assert (back == host).all()


def test_torch_tensors_and_mapping():
    torch = optional("torch")
    optional("numpy")
    rows, elems = 16, 250  # blocks of 1000 bytes of float32
    src = torch.randn(rows, elems)
    dst = torch.zeros(2 * rows, elems)
    mapping = torch.tensor([[r, 2 * r + 1] for r in range(rows)], dtype=torch.int64)
    pinmem.copy_blocks(dst, src, mapping, elems * 4)
    assert torch.equal(dst[1::2], src) and not dst[0::2].any()


@requires_cuda
def test_torch_kv_cache_on_its_stream():
    """vLLM's way: blocks of a CUDA tensor to a pinned CPU one and back, on
    PyTorch's stream, after work queued there."""
    torch = optional("torch")
    optional("numpy")
    blocks, elems = 64, 16 << 10  # 64 KiB blocks of float32
    cache = torch.randn(2 * blocks, elems, device="cuda")
    host = torch.empty(blocks, elems, pin_memory=True)
    order = random.Random(7).sample(range(blocks), blocks)
    mapping = torch.tensor([(2 * b, b) for b in order])  # cache block 2b to host block b
    s = torch.cuda.current_stream()
    cache.mul_(2.0)  # queued before the copy on its stream: the copy must see it
    pinmem.copy_blocks(host, cache, mapping, elems * 4, stream=s)
    s.synchronize()
    assert torch.equal(host, cache[0::2].cpu())
    back = torch.zeros_like(cache)
    pinmem.copy_blocks(back, host, mapping.flip(1), elems * 4, stream=s)
    s.synchronize()
    assert torch.equal(back[0::2], cache[0::2]) and not back[1::2].any()


def test_bad_input_is_refused(mapping_path):
    n = BLOCKS * BLOCK
    src = bytearray(n)
    with pinmem.device_empty(n) as dev:
        with pytest.raises(TypeError, match="block_bytes must be an int"):
            pinmem.copy_blocks(dev, src, [(0, 0)], 1.5)
        with pytest.raises(ValueError, match="block_bytes must be positive"):
            pinmem.copy_blocks(dev, src, [(0, 0)], 0)
        with pytest.raises(ValueError, match=r"mapping\[1\] names source block 24, but the "
                                             r"source holds blocks 0 to 23"):
            pinmem.copy_blocks(dev, src, [(0, 0), (BLOCKS, 1)], BLOCK)
        with pytest.raises(ValueError, match=r"mapping\[0\] names destination block -1"):
            pinmem.copy_blocks(dev, src, [(0, -1)], BLOCK)
        with pytest.raises(ValueError, match="smaller than one block"):
            pinmem.copy_blocks(dev, src, [(0, 0)], n + 1)
        with pytest.raises((TypeError, ValueError), match="mapping"):
            pinmem.copy_blocks(dev, src, [(0, 1, 2)], BLOCK)
        with pytest.raises(TypeError, match="ints"):
            pinmem.copy_blocks(dev, src, [(0.0, 1)], BLOCK)
        with pytest.raises(TypeError, match=r"mapping\[1\] must hold ints, not bool"):
            pinmem.copy_blocks(dev, src, [(0, 0), (True, 1)], BLOCK)
        with pytest.raises(ValueError, match=r"mapping\[0\] names destination block "
                                             r"1180591620717411303424"):
            pinmem.copy_blocks(dev, src, [(0, 1 << 70)], BLOCK)
        with pytest.raises(TypeError, match="pairs"):
            pinmem.copy_blocks(dev, src, 7, BLOCK)
        with pytest.raises(TypeError, match="knows its size"):
            pinmem.copy_blocks(dev.ptr, src, [(0, 0)], BLOCK)
        with pytest.raises(TypeError, match="stream"):
            pinmem.copy_blocks(dev, src, [(0, 0)], BLOCK, stream="a stream")
        with pytest.raises(ValueError, match="read-only"):
            pinmem.copy_blocks(bytes(n), dev, [(0, 0)], BLOCK)
        # a destination block named twice: the library's overlap check
        with pytest.raises(pinmem.PinmemError) as e:
            pinmem.copy_blocks(dev, src, [(0, 3), (1, 3)], BLOCK)
        assert e.value.result == "PM_ERROR_INVALID_VALUE"
        assert "element 1" in e.value.detail and "element 0" in e.value.detail
    # within one object, a pair whose source another pair writes: refused too
    host = bytearray(b"a" * BLOCK + b"b" * BLOCK + b"c" * BLOCK)
    with pytest.raises(pinmem.PinmemError, match="overlaps element 0's destination"):
        pinmem.copy_blocks(host, host, [(0, 1), (1, 2)], BLOCK)
    assert host == b"a" * BLOCK + b"b" * BLOCK + b"c" * BLOCK


def test_bad_arrays_are_refused():
    np = optional("numpy")
    with pinmem.device_empty(4 * BLOCK) as dev:
        src = bytearray(4 * BLOCK)
        with pytest.raises(ValueError, match=r"shape \(n, 2\)"):
            pinmem.copy_blocks(dev, src, np.zeros(4, dtype=np.int64), BLOCK)
        with pytest.raises(TypeError, match="must hold ints, not float64"):
            pinmem.copy_blocks(dev, src, np.zeros((1, 2)), BLOCK)
        with pytest.raises(ValueError, match="destination block 4"):
            pinmem.copy_blocks(dev, src, np.array([[0, 4]], dtype=np.uint64), BLOCK)
        with pytest.raises(ValueError, match="must be pairs"):
            pinmem.copy_blocks(dev, src, [(0, 1), (2,)], BLOCK)
