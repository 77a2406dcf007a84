"""pinmem.Pool: allocation, trimming, statistics, thresholds."""

import pytest

import pinmem
from conftest import skip_unless_pools_fit


@pytest.fixture(autouse=True)
def _pools_fit():
    skip_unless_pools_fit()


def test_alloc_free_stats():
    with pinmem.Pool() as pool:
        bufs = [pool.alloc(n) for n in (1, 100, 4096, 70000)]
        for b in bufs:
            assert b.pool is pool and b.ptr
        st = pool.stats()
        assert st["live"] == 4 and st["requested"] == 1 + 100 + 4096 + 70000
        for b in bufs:
            b.close()
        assert pool.stats()["live"] == 0
        pool.trim(0)
        assert pool.stats()["reserved"] == 0 or pinmem.backend() == "cuda"


def test_empty_from_pool():
    with pinmem.Pool() as pool:
        b = pinmem.empty(1000, pool=pool)
        assert b.pool is pool
        b.close()
        with pytest.raises(ValueError, match="flags"):
            pinmem.empty(1000, pool=pool, flags=1)


def test_default_pool():
    pool = pinmem.Pool.default()
    b = pool.alloc(512)
    b.close()
    pool.close()  # the process-wide pool lives on
    assert pinmem.Pool.default().alloc(16).nbytes == 16


def test_release_threshold_and_max_size():
    with pinmem.Pool(release_threshold=0, max_size=64 << 20) as pool:
        assert pool.release_threshold == 0
        pool.release_threshold = 1 << 20
        assert pool.release_threshold == 1 << 20
        with pytest.raises(pinmem.PinmemMemoryError):
            pool.alloc(128 << 20)


def test_numa_location():
    caps = pinmem.capabilities()
    node = max(caps["host_numa_node"], 0)
    with pinmem.Pool(("numa", node)) as pool:
        pool.alloc(64).close()
    with pytest.raises(pinmem.PinmemError) as e:
        pinmem.Pool(("numa", 999))
    assert e.value.result == "PM_ERROR_INVALID_VALUE"


def test_bad_arguments():
    with pytest.raises(ValueError):
        pinmem.Pool("device")
    with pytest.raises(ValueError):
        pinmem.Pool(("numa", "zero"))
    with pytest.raises(ValueError):
        pinmem.Pool(max_size=-1)
    with pytest.raises(ValueError):
        pinmem.Pool(release_threshold=-1)
    with pinmem.Pool() as pool:
        with pytest.raises(ValueError):
            pool.trim(-1)
        with pytest.raises(TypeError):
            pool.alloc("big")
        with pytest.raises(ValueError):
            pool.alloc(-1)
    with pytest.raises(ValueError, match="closed"):
        pool.alloc(1)
    with pytest.raises(TypeError):
        pinmem.empty(10, pool="default")


def test_buffer_outlives_its_pool_object():
    pool = pinmem.Pool()
    b = pool.alloc(4096)
    b[0] = 1
    pool.close()  # destroying a pool with live memory succeeds; the buffer keeps its memory
    assert b[0] == 1
    b.close()


def test_global_stats():
    st = pinmem.stats()
    assert "reserved" in st["pools"] and "staged_bytes" in st["copy"]
