"""pinmem.cupy: CuPy's pinned allocator from pinmem pools (needs CuPy and a GPU)."""

import pytest

from conftest import requires_cuda

cupy = pytest.importorskip("cupy", reason="CuPy is not installed here")
pytestmark = requires_cuda

import pinmem  # noqa: E402


def test_install_and_pinned_arrays():
    import cupyx
    import numpy as np

    pc = pinmem.cupy
    with pinmem.Pool() as pool:
        pc.install(pool)
        try:
            a = cupyx.empty_pinned((1024, 256), dtype=np.float32)
            assert pool.stats()["live"] >= 1
            a[:] = np.arange(a.size, dtype=np.float32).reshape(a.shape)
            d = cupy.asarray(a)
            b = cupyx.empty_like_pinned(a)
            d.get(out=b)
            assert (a == b).all()
            del a, b, d
        finally:
            pc.uninstall()
    # CuPy's own pooled allocator is back: a freed block stays in its pool.
    x = cupyx.empty_pinned((1024,), dtype=np.float32)
    del x
    assert cupy.get_default_pinned_memory_pool().n_free_blocks() >= 1


def test_copy_cupy_arrays():
    import numpy as np

    h = np.random.default_rng(1).standard_normal(1 << 20).astype(np.float32)
    d = cupy.empty_like(cupy.asarray(h))
    pinmem.copy(d, h)
    assert (cupy.asnumpy(d) == h).all()
    out = np.empty_like(h)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        d2 = d * 2
    pinmem.copy(out, d2, stream=s)  # the array's stream is ordered before ours
    assert (out == h * 2).all()


def test_bad_pool():
    with pytest.raises(TypeError):
        pinmem.cupy.install(pool="default")
