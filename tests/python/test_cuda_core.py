"""pinmem.cuda_core: PinmemMemoryResource (needs cuda.core and a GPU)."""

import pytest

from conftest import requires_cuda

core = pytest.importorskip("cuda.core", reason="cuda.core is not installed here")
pytestmark = requires_cuda

import pinmem  # noqa: E402


def test_resource_hands_out_pinmem_memory():
    from cuda.core import Device

    dev = Device()
    dev.set_current()
    stream = dev.create_stream()
    with pinmem.Pool() as pool:
        mr = pinmem.cuda_core.PinmemMemoryResource(pool)
        assert mr.is_host_accessible and mr.is_device_accessible and mr.device_id == -1
        buf = mr.allocate(1 << 20, stream=stream)
        assert buf.size == 1 << 20 and int(buf.handle)
        assert pool.stats()["live"] == 1
        dbuf = dev.memory_resource.allocate(1 << 20, stream=stream)
        host = bytearray(range(256)) * 4096
        pinmem.copy(int(buf.handle), host, stream=stream)
        buf.copy_to(dbuf, stream=stream)
        out = bytearray(1 << 20)
        pinmem.copy(out, int(dbuf.handle), 1 << 20, stream=stream)
        assert out == host
        buf.close(stream)
        dbuf.close(stream)
        stream.sync()
        assert pool.stats()["live"] == 0
        sync_buf = mr.allocate(4096)
        sync_buf.close()
        # cuda.core passes the stream by position too (Buffer.close, copy_to).
        positional = mr.allocate(4096, stream)
        assert pool.stats()["live"] == 1
        positional.close(stream)
        stream.sync()
        assert pool.stats()["live"] == 0


def test_resource_of_a_closed_pool_raises():
    pool = pinmem.Pool()
    mr = pinmem.cuda_core.PinmemMemoryResource(pool)
    pool.close()
    with pytest.raises(ValueError, match="PinmemMemoryResource.allocate: the pool is closed"):
        mr.allocate(4096)
