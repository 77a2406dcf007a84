"""pinmem.register: in place, kept alive, unregistered on close / with / GC."""

import gc
import weakref

import pytest

import pinmem
from conftest import optional


def test_bytearray():
    data = bytearray(b"x" * 10000)
    r = pinmem.register(data)
    assert r.nbytes == 10000 and r.obj is data and not r.closed
    with pytest.raises(BufferError):
        data.extend(b"more")  # the registration holds an export: no resizing under it
    r.close()
    data.extend(b"more")
    assert r.closed and r.obj is None
    r.close()


def test_registered_memory_is_copied_in_place():
    data = bytearray(range(256)) * 64
    dev = pinmem.device_empty(len(data))
    out = bytearray(len(data))
    with pinmem.register(data) as r:
        pinmem.copy(dev, r)
        pinmem.copy(out, dev)
    assert out == data
    dev.close()


def test_numpy_array():
    np = optional("numpy")
    a = np.arange(4096, dtype=np.float64)
    with pinmem.register(a) as r:
        assert r.ptr == a.__array_interface__["data"][0]
        assert r.nbytes == a.nbytes
        # registering the same memory twice is the driver's answer
        with pytest.raises(pinmem.PinmemError) as e:
            pinmem.register(a)
        assert e.value.result == "PM_ERROR_HOST_MEMORY_ALREADY_REGISTERED"
    again = pinmem.register(a)
    again.close()


def test_read_only_needs_the_flag():
    np = optional("numpy")
    a = np.zeros(1024)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        pinmem.register(a)
    with pytest.raises(ValueError, match="read-only"):
        pinmem.register(b"immutable bytes" * 100)
    r = pinmem.register(b"immutable bytes" * 100, flags=pinmem.HOSTREGISTER_READ_ONLY)
    r.close()


def test_torch_cpu_tensor():
    torch = optional("torch")
    t = torch.ones(2048, dtype=torch.float32)
    with pinmem.register(t) as r:
        assert r.ptr == t.data_ptr() and r.nbytes == t.numel() * 4


def test_object_kept_alive_and_unregistered_on_gc():
    np = optional("numpy")
    a = np.ones(8192, dtype=np.uint8)
    ref = weakref.ref(a)
    r = pinmem.register(a)
    ptr = r.ptr
    del a
    gc.collect()
    assert ref() is not None  # the registration keeps it
    del r
    gc.collect()
    assert ref() is None
    assert ptr


def test_bad_objects():
    np = optional("numpy")
    with pytest.raises(TypeError):
        pinmem.register(12345)
    with pytest.raises(TypeError):
        pinmem.register("text")
    with pytest.raises(TypeError):
        pinmem.register(object())
    with pytest.raises(ValueError, match="contiguous"):
        pinmem.register(np.zeros((64, 64))[:, ::2])
    with pytest.raises(ValueError, match="empty"):
        pinmem.register(bytearray())
    with pytest.raises(ValueError, match="page-locked already"):
        with pinmem.empty(64) as b:
            pinmem.register(b)
    with pytest.raises(ValueError, match="flags"):
        pinmem.register(bytearray(64), flags=0x100)
    with pytest.raises(TypeError):
        pinmem.register(bytearray(64), flags="portable")


def test_closed_registration_cannot_be_copied():
    data = bytearray(64)
    r = pinmem.register(data)
    r.close()
    with pytest.raises(ValueError, match="closed"):
        pinmem.copy(bytearray(64), r)
    with pytest.raises(ValueError, match="closed"):
        r.ptr


def test_close_waits_for_copies_in_other_threads():
    """close() from one thread while another copies: refused (BufferError)
    until the copy returns, never freeing memory under it. In a child, where
    a failure would be a crash."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import threading, pinmem
        n = 4 << 20
        outcomes = []
        for round in range(40):
            for kind in ("buffer", "registration"):
                data = bytearray(n)
                owner = pinmem.empty(n) if kind == "buffer" else pinmem.register(bytearray(n))
                def copy():
                    try:
                        pinmem.copy(data, owner)
                        outcomes.append("copied")
                    except ValueError as e:
                        assert "closed" in str(e), e  # closed before it began
                        outcomes.append("closed first")
                t = threading.Thread(target=copy)
                t.start()
                while True:
                    try:
                        owner.close()
                        break
                    except BufferError:
                        outcomes.append("refused")
                t.join()
        print("survived", sorted(set(outcomes)))
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(pinmem.__file__))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and "survived" in run.stdout, (run.returncode, run.stderr[-2000:])
