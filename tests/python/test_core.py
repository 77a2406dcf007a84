"""pinmem.empty and Buffer: memory, views, DLPack, closing, lifetime."""

import gc
import sys
import weakref

import pytest

import pinmem
from conftest import optional

NATIVE = sys.version_info >= (3, 12)


def test_backend_version_capabilities():
    assert pinmem.backend() in ("cuda", "posix")
    assert pinmem.version() == pinmem.__version__
    caps = pinmem.capabilities()
    assert caps["backend"] == pinmem.backend()
    assert caps["page_size"] >= 4096
    assert isinstance(caps["unified_addressing"], bool)
    assert pinmem.library_path()


def test_empty_is_page_locked_host_memory():
    with pinmem.empty(3 * 4096 + 5) as b:
        assert b.nbytes == len(b) == 3 * 4096 + 5
        assert b.ptr % 4096 == 0
        assert b.pool is None and not b.closed
        b[0] = 17
        b[b.nbytes - 1] = 99
        assert b[0] == 17 and b[b.nbytes - 1] == 99
        assert bytes(b[1:4]) == bytes(b[1:4])
    assert b.closed


def test_zero_bytes():
    b = pinmem.empty(0)
    assert b.nbytes == 0 and b.ptr == 0
    b.close()


def test_flags():
    b = pinmem.empty(4096, flags=pinmem.HOSTALLOC_PORTABLE | pinmem.HOSTALLOC_WRITECOMBINED)
    assert b.flags == pinmem.HOSTALLOC_PORTABLE | pinmem.HOSTALLOC_WRITECOMBINED
    b.close()


def test_memoryview_shares_memory():
    b = pinmem.empty(64)
    m = memoryview(b).cast("B")
    m[3] = 42
    assert b[3] == 42
    assert m.nbytes == 64 and not m.readonly
    m.release()
    b.close()


def test_numpy_shares_memory():
    np = optional("numpy")
    b = pinmem.empty(4096)
    a = np.asarray(b)
    assert a.dtype == np.uint8 and a.shape == (4096,)
    a[:] = 5
    assert b[100] == 5
    f = b.numpy("float32", (16, 8))
    assert f.shape == (16, 8) and f.dtype == np.float32
    f[:] = 1.5
    assert np.frombuffer(bytes(b[0:4]), dtype=np.float32)[0] == 1.5
    i = b.numpy(np.int64)
    assert i.shape == (512,)
    assert np.asarray(b.__array_interface__["data"][0]) == b.ptr
    del a, f, i
    b.close()


def test_torch_shares_memory():
    torch = optional("torch")
    b = pinmem.empty(1024)
    t = torch.frombuffer(b, dtype=torch.uint8)
    t.fill_(9)
    assert b[1023] == 9
    v = b.torch(torch.int32, (16, 16))
    assert v.shape == (16, 16) and v.dtype == torch.int32
    v.fill_(-1)
    assert b[0] == 255
    assert b.torch().shape == (1024,)
    del t, v
    gc.collect()
    b.close()


def test_views_check_their_shape():
    np = optional("numpy")
    b = pinmem.empty(100)
    with pytest.raises(ValueError, match="whole number"):
        b.numpy(np.float64)
    with pytest.raises(ValueError, match="needs 800 bytes"):
        b.numpy(np.float64, (10, 10))
    with pytest.raises(ValueError):
        b.numpy("uint8", (-1,))
    b.close()


def test_dlpack_cpu_by_default():
    torch = optional("torch")
    b = pinmem.empty(256)
    assert b.__dlpack_device__() == (1, 0)
    t = torch.from_dlpack(b)
    assert t.device.type == "cpu" and t.numel() == 256
    t.fill_(3)
    assert b[255] == 3
    typed = torch.from_dlpack(b.dlpack_view("float32", (8, 8)))
    assert typed.shape == (8, 8) and typed.dtype == torch.float32
    del t, typed
    gc.collect()
    b.close()


def test_dlpack_numpy():
    np = optional("numpy")
    if not hasattr(np, "from_dlpack"):
        pytest.skip("this numpy has no from_dlpack")
    b = pinmem.empty(64)
    a = np.from_dlpack(b)  # numpy makes DLPack imports read-only
    b[10] = 7
    assert a[10] == 7 and a.shape == (64,)
    del a
    gc.collect()
    b.close()


def test_dlpack_capsules_are_released():
    from pinmem import _dlpack

    gc.collect()
    before = _dlpack.live_exports()
    b = pinmem.empty(64)
    cap = b.__dlpack__()
    assert _dlpack.live_exports() == before + 1
    del cap  # never consumed: the capsule's destructor lets go
    gc.collect()
    assert _dlpack.live_exports() == before
    b.close()


def test_dlpack_tensors_let_go_of():
    """A consumer's tensor holds the buffer until it is gone; then close()
    works and the export is let go of."""
    np = pytest.importorskip("numpy")
    from pinmem import _dlpack

    gc.collect()
    before = _dlpack.live_exports()
    b = pinmem.empty(64)
    a = np.from_dlpack(b)
    assert _dlpack.live_exports() == before + 1
    del a
    gc.collect()  # its pass over the older generations lets go of the export
    assert len(_dlpack._live) == before
    b.close()


def test_dlpack_many_capsules_let_go_of():
    """Capsules made and dropped in a loop do not pile up."""
    from pinmem import _dlpack

    gc.collect()
    before = _dlpack.live_exports()
    b = pinmem.empty(64)
    for _ in range(1000):
        b.__dlpack__()
    assert len(_dlpack._live) <= before + 200
    assert _dlpack.live_exports() == before
    b.close()


def test_dlpack_pinned_host_view():
    b = pinmem.empty(64)
    view = b.dlpack_view(device="cuda_host")
    assert view.__dlpack_device__() == (3, 0)
    cap = view.__dlpack__()
    assert type(cap).__name__ == "PyCapsule"
    del cap
    with pytest.raises(BufferError):
        b.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError):
        b.__dlpack__(copy=True)
    with pytest.raises(ValueError):
        b.dlpack_view(device="gpu")
    with pytest.raises(TypeError):
        b.dlpack_view(dtype="float128")
    gc.collect()
    b.close()


def test_close_twice_and_use_after_close():
    b = pinmem.empty(64)
    b.close()
    b.close()
    with pytest.raises(ValueError, match="closed"):
        b.ptr
    with pytest.raises(ValueError, match="closed"):
        b[0]
    with pytest.raises(ValueError, match="closed"):
        b[0] = 1
    with pytest.raises(ValueError, match="closed"):
        b[0:16]
    with pytest.raises(ValueError, match="closed"):
        b.__array_interface__
    with pytest.raises(ValueError, match="closed"):
        b.__dlpack__()
    assert "closed" in repr(b)


@pytest.mark.skipif(not NATIVE, reason="exports are counted from Python 3.12 on")
def test_close_refuses_while_exported():
    b = pinmem.empty(64)
    m = memoryview(b)
    with pytest.raises(BufferError, match="still alive"):
        b.close()
    m.release()
    cap = b.__dlpack__()
    with pytest.raises(BufferError):
        b.close()
    del cap
    gc.collect()
    try:
        import numpy
    except ImportError:
        numpy = None
    if numpy is not None:
        a = b.numpy()
        with pytest.raises(BufferError):
            b.close()
        del a
        gc.collect()
    b.close()
    with pytest.raises(ValueError):
        memoryview(b)


def test_freed_on_garbage_collection():
    b = pinmem.empty(8192)
    ref = weakref.ref(b)
    ptr = b.ptr
    del b
    gc.collect()
    assert ref() is None
    # the same pages are free for a new allocation (the registry forgot them)
    with pinmem.empty(8192) as again:
        assert again.ptr
    assert ptr


def test_forked_child_lets_go_beside_locks_held_at_fork():
    """A child forked while another thread of the parent held the locks that
    letting go of a pinmem object takes (as a thread making or closing one
    does) lets go of the objects it inherited: the child refuses every call
    (pinmem.h, pm_init), but their finalizers still run there, and no thread
    of the child will ever release what the parent's thread held."""
    import os
    import signal
    import threading

    from pinmem import _buffer, _register, _resolve

    objects = [pinmem.empty(4096), pinmem.device_empty(4096),
               pinmem.register(bytearray(8192))]
    held, release = threading.Event(), threading.Event()

    def hold():  # in the order closing takes them
        with _buffer._close_lock, _register._lock, _resolve._owned_lock:
            held.set()
            release.wait()

    # No finalizer may run here meanwhile: it would wait for the holder.
    gc.collect()
    gc.disable()
    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.alarm(10)  # a hang fails the test rather than stalling it
                objects.clear()
                gc.collect()
                code = 0
            finally:
                os._exit(code)
    finally:
        release.set()
        holder.join()
        gc.enable()
    _, status = os.waitpid(pid, 0)
    assert not os.WIFSIGNALED(status), f"the child hung (signal {os.WTERMSIG(status)})"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    for o in objects:
        o.close()


def test_not_made_directly():
    with pytest.raises(TypeError):
        pinmem.Buffer()
    with pytest.raises(TypeError):
        pinmem.Registration()


def test_device_buffer():
    d = pinmem.device_empty(1000)
    assert d.nbytes == 1000 and d.ptr and not d.closed
    d.close()
    d.close()
    with pytest.raises(ValueError):
        d.ptr
    with pinmem.device_empty(16) as e:
        assert "DeviceBuffer" in repr(e)


def test_info_runs():
    import subprocess

    run = subprocess.run([sys.executable, "-m", "pinmem", "info"], capture_output=True, text=True,
                         env=_env())
    assert run.returncode == 0, run.stderr
    assert "backend:" in run.stdout
    assert "PINMEM_THREAD_CPUS" in run.stdout


@pytest.mark.parametrize("bad", ["--reps=0", "--pin-sizes=-1M", "--sizes=1.5", "--sizes=1M,x"])
def test_bench_refuses_bad_options(bad):
    import subprocess

    run = subprocess.run([sys.executable, "-m", "pinmem", "bench", "pin", bad],
                         capture_output=True, text=True, env=_env())
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "error: argument" in run.stderr


def test_settings_name_every_variable():
    s = pinmem.settings()
    assert {"PINMEM_BACKEND", "PINMEM_THREAD_CPUS", "PINMEM_COPY_WORKERS"} <= set(s)
    cpus = s["PINMEM_THREAD_CPUS"]
    assert cpus["value"] in ("caller", "process")
    assert cpus["source"] in ("default", "environment")
    assert cpus["default"] == "caller" and "process" in cpus["allowed"] and cpus["doc"]
    assert int(s["PINMEM_COPY_WORKERS"]["value"]) >= 1


def _settings_in_child(**variables):
    import subprocess

    code = ("import pinmem\n"
            "try:\n"
            "    s = pinmem.settings()['PINMEM_THREAD_CPUS']\n"
            "    print(s['value'], s['source'])\n"
            "except pinmem.PinmemError as e:\n"
            "    print(e.result)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**_env(), **variables})
    assert run.returncode == 0, run.stderr
    return run.stdout.split()


def test_settings_read_the_environment():
    assert _settings_in_child(PINMEM_THREAD_CPUS="process") == ["process", "environment"]
    assert _settings_in_child(PINMEM_THREAD_CPUS="all") == ["PM_ERROR_INVALID_VALUE"]


def _env():
    import os
    from pathlib import Path

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(pinmem.__file__).parent.parent),
                                                      env.get("PYTHONPATH")]))
    return env
