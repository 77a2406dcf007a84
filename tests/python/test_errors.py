"""Bad input of every kind: PinmemError, TypeError or ValueError with a clear
message, never a crash."""

import ctypes
import pickle
import subprocess
import sys
import textwrap

import pytest

import pinmem
from conftest import optional


def test_pinmem_error_fields():
    with pytest.raises(pinmem.PinmemError) as e:
        pinmem.Pool(("numa", 999))
    err = e.value
    assert err.result == "PM_ERROR_INVALID_VALUE"
    assert err.code == 1
    assert "999" in err.detail or err.detail
    assert err.result in str(err)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.result, copy.detail, copy.code) == (err.result, err.detail, err.code)


def test_out_of_memory_is_a_memory_error():
    with pytest.raises(MemoryError) as e:
        pinmem.empty(1 << 50)
    assert isinstance(e.value, pinmem.PinmemError)
    assert isinstance(e.value, pinmem.PinmemMemoryError)
    assert e.value.result == "PM_ERROR_OUT_OF_MEMORY"
    with pytest.raises(MemoryError):
        pinmem.device_empty(1 << 62)


def test_empty_arguments():
    with pytest.raises(TypeError, match="nbytes"):
        pinmem.empty("100")
    with pytest.raises(TypeError):
        pinmem.empty(10.0)
    with pytest.raises(TypeError):
        pinmem.empty(True)
    with pytest.raises(ValueError, match="negative"):
        pinmem.empty(-1)
    with pytest.raises(ValueError):
        pinmem.empty(1 << 64)
    with pytest.raises(ValueError, match="flags"):
        pinmem.empty(10, flags=0x80)
    with pytest.raises(TypeError):
        pinmem.empty(10, flags=None)
    with pytest.raises(ValueError):
        pinmem.device_empty(-5)
    with pytest.raises(pinmem.PinmemError):
        pinmem.device_empty(0)  # as cuMemAlloc: size 0 is refused


def test_copy_wrong_types():
    dst = bytearray(16)
    for bad in ("text", 1.5, None, object(), [1, 2, 3], {"a": 1}, True, str):
        with pytest.raises(TypeError):
            pinmem.copy(dst, bad)
        with pytest.raises(TypeError):
            pinmem.copy(bad, bytearray(16))


def test_copy_read_only_destination():
    np = optional("numpy")
    with pytest.raises(ValueError, match="read-only"):
        pinmem.copy(b"immutable" * 2, bytearray(18))
    a = np.zeros(4)
    a.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        pinmem.copy(a, np.ones(4))
    with pytest.raises(ValueError, match="read-only"):
        pinmem.copy(memoryview(bytearray(4)).toreadonly(), bytearray(4))


def test_copy_non_contiguous():
    np = optional("numpy")
    a = np.zeros((32, 32))
    with pytest.raises(ValueError, match="contiguous"):
        pinmem.copy(a[:, ::2], np.zeros((32, 16)))
    with pytest.raises(ValueError, match="contiguous"):
        pinmem.copy(np.zeros((16, 32)), a.T[::2])
    with pytest.raises(ValueError, match="contiguous"):
        pinmem.copy(bytearray(8), memoryview(bytearray(16))[::2])
    torch = pytest.importorskip("torch")
    t = torch.zeros(8, 8)
    with pytest.raises(ValueError, match="contiguous"):
        pinmem.copy(t.t(), torch.zeros(8, 8))
    # contiguous slices are fine
    pinmem.copy(a[4:8], np.ones((4, 32)))
    assert a[5, 3] == 1


def test_copy_closed_objects():
    b = pinmem.empty(16)
    b.close()
    with pytest.raises(ValueError, match="closed"):
        pinmem.copy(bytearray(16), b)
    d = pinmem.device_empty(16)
    d.close()
    with pytest.raises(ValueError, match="closed"):
        pinmem.copy(d, bytearray(16))


def test_copy_overlap_and_null():
    data = bytearray(64)
    with pinmem.register(data) as r:
        with pytest.raises(pinmem.PinmemError, match="overlap"):
            pinmem.copy(r.ptr + 8, r.ptr, 16)
    with pytest.raises(pinmem.PinmemError) as e:
        pinmem.copy(0, bytearray(16))
    assert e.value.result == "PM_ERROR_INVALID_VALUE"
    with pytest.raises(ValueError):
        pinmem.copy(-1, bytearray(16))
    with pytest.raises(ValueError):
        pinmem.copy(1 << 64, bytearray(16))


def test_sizes_past_64_bits():
    # ctypes would take them modulo 2**64: a short copy, a small pool
    d, s = pinmem.empty(16), pinmem.empty(16)
    with pytest.raises(ValueError, match="more than any memory"):
        pinmem.copy(d.ptr, s.ptr, nbytes=(1 << 64) + 4)
    with pytest.raises(ValueError, match="max_size"):
        pinmem.Pool(max_size=(1 << 64) + 4096)
    with pinmem.Pool() as pool:
        with pytest.raises(ValueError, match="keep"):
            pool.trim(1 << 64)
    with pytest.raises(ValueError, match="location"):
        pinmem.Pool(("numa", 1 << 40))
    with pytest.raises(ValueError, match="0-byte"):
        d.numpy("S0")


def test_object_arrays_refused():
    np = optional("numpy")
    objects = np.empty(4, dtype=object)
    with pytest.raises(ValueError, match="Python objects"):
        pinmem.copy(objects, np.zeros(32, np.uint8))
    with pytest.raises(ValueError, match="Python objects"):
        pinmem.copy(np.zeros(32, np.uint8), objects)

    class Interface:
        __array_interface__ = objects.__array_interface__

    with pytest.raises(ValueError, match="Python objects"):
        pinmem.copy(Interface(), np.zeros(32, np.uint8))
    with pytest.raises(ValueError, match="Python objects"):
        pinmem.copy(np.zeros(32, np.uint8), np.zeros(2, dtype=[("a", "i8"), ("b", "O")]))
    nested = np.zeros(2, dtype=[("a", "i8"), ("inner", [("Other", "i8")])])

    class Fields:
        __array_interface__ = nested.__array_interface__

    with pytest.raises(ValueError, match="Python objects"):
        pinmem.copy(np.zeros(32, np.uint8),
                     np.zeros(2, dtype=[("a", "i8"), ("inner", [("b", "O")])]))
    pinmem.copy(np.zeros(32, np.uint8), Fields())  # a field named O..., no objects


def test_int_address_in_read_only_registration():
    data = b"immutable bytes" * 100
    with pinmem.register(data, flags=pinmem.HOSTREGISTER_READ_ONLY) as r:
        with pytest.raises(ValueError, match="read-only"):
            pinmem.copy(r.ptr + 4, b"x" * 16)
        with pytest.raises(ValueError, match="read-only"):
            pinmem.copy_batch([r.ptr], [pinmem.empty(8).ptr], [8])
        out = bytearray(16)
        pinmem.copy(out, r.ptr, 16)
    assert data.startswith(b"immutable bytes") and bytes(out) == data[:16]


_PAGES = 1 << 16


def _pinned_pages(kind):
    """Page-locked memory of the given kind (a registration of mmap pages or
    a pinmem.empty Buffer), its address, and a function that closes it."""
    if kind == "buffer":
        b = pinmem.empty(_PAGES)
        return b.ptr, b.close
    import mmap

    r = pinmem.register(mmap.mmap(-1, _PAGES))
    return r.ptr, r.close


@pytest.mark.parametrize("kind", ["registration", "buffer"])
def test_inaccessible_pinned_memory(kind):
    # the driver reads a small copy's page-locked side with the CPU, and a
    # host-to-host copy is the CPU's: pages made PROT_NONE must raise
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    ptr, close = _pinned_pages(kind)
    try:
        assert libc.mprotect(ptr, _PAGES, 0) == 0  # PROT_NONE
        try:
            with pinmem.device_empty(16) as dev:
                for dst, src in ((bytearray(16), ptr + 64), (dev, ptr), (ptr, b"x" * 16), (ptr, dev)):
                    with pytest.raises(ValueError, match="neither (readable|writable) host memory"):
                        pinmem.copy(dst, src, 16)
                with pytest.raises(ValueError, match="element 1's source"):
                    pinmem.copy_batch([dev.ptr, dev.ptr + 8], [dev.ptr + 8, ptr], [8, 8])
        finally:
            assert libc.mprotect(ptr, _PAGES, mmap.PROT_READ | mmap.PROT_WRITE) == 0
        out = bytearray(16)
        pinmem.copy(ptr, b"y" * 16)
        pinmem.copy(out, ptr, 16)
        assert bytes(out) == b"y" * 16
    finally:
        close()


def test_posix_checks_device_ranges_and_streams():
    if pinmem.backend() != "posix":
        pytest.skip("the driver answers these on the cuda backend")
    with pinmem.device_empty(64) as dev:
        with pytest.raises(pinmem.PinmemError, match="past the end"):
            pinmem.copy(dev.ptr + 32, bytearray(64))
        with pytest.raises(pinmem.PinmemError) as e:
            pinmem.copy(dev, bytearray(64), stream=0x1234)
        assert e.value.result == "PM_ERROR_INVALID_HANDLE"
        s = pinmem.Stream()
        handle = s.handle
        s.close()
        with pytest.raises(pinmem.PinmemError):
            pinmem.copy(dev, bytearray(64), stream=handle)
        with pytest.raises(ValueError, match="closed"):
            pinmem.copy(dev, bytearray(64), stream=s)


def test_foreign_pointers():
    # memory pinmem does not own: the library's answers, not a crash
    with pytest.raises(pinmem.PinmemError):
        pinmem._lib.load().pm_mem_free_host(12345) and pinmem._errors.check(
            pinmem._lib.load().pm_mem_free_host(12345))
    with pytest.raises(pinmem.PinmemError):
        pinmem._errors.check(pinmem._lib.load().pm_device_free(4096 * 7))


def test_dlpack_bad_capsules():
    class NotACapsule:
        def __dlpack__(self, stream=None):
            return "capsule"

        def __dlpack_device__(self):
            return (1, 0)

    class Elsewhere:
        def __dlpack__(self, stream=None):
            raise AssertionError("not called")

        def __dlpack_device__(self):
            return (7, 0)  # Vulkan

    with pytest.raises(TypeError, match="DLPack"):
        pinmem.copy(bytearray(4), NotACapsule())
    with pytest.raises(ValueError, match="CPU or CUDA"):
        pinmem.copy(bytearray(4), Elsewhere())


def test_a_crash_would_show():
    # everything above again in a child process: a crash there is a failure here
    code = textwrap.dedent("""
        import pinmem

        def object_array():
            try:
                import numpy
            except ImportError:
                return
            pinmem.copy(numpy.empty(4, dtype=object), bytes(32))

        def read_only():
            import mmap
            pages = mmap.mmap(-1, 1 << 16, prot=mmap.PROT_READ)
            with pinmem.register(pages, flags=pinmem.HOSTREGISTER_READ_ONLY) as r:
                pinmem.copy(r.ptr, bytes(16))

        def slice_kept():
            import gc
            b = pinmem.empty(1 << 16)
            b[:4] = b"abcd"
            view = b[:8]
            del b
            gc.collect()
            view[4] = 5
            assert bytes(view[:5]) == b"abcd\\x05", bytes(view)

        def made_inaccessible():
            if pinmem.backend() != "posix":
                return  # a registration made PROT_NONE passes the check on cuda
            import ctypes, mmap
            libc = ctypes.CDLL(None)
            libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            with pinmem.register(mmap.mmap(-1, 1 << 16)) as r:
                libc.mprotect(r.ptr, 1 << 16, 0)  # PROT_NONE
                try:
                    pinmem.copy(bytearray(16), r.ptr, 16)
                finally:
                    libc.mprotect(r.ptr, 1 << 16, mmap.PROT_READ | mmap.PROT_WRITE)

        for bad in (slice_kept, lambda: pinmem.copy(0, 0, 16), lambda: pinmem.copy(0x500000000000, 0x510000000000, 16),
                    lambda: pinmem.empty(-1), lambda: pinmem.register(1), object_array, read_only,
                    made_inaccessible):
            try:
                bad()
            except (pinmem.PinmemError, TypeError, ValueError):
                pass
        print("survived")
    """)
    import os
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(pinmem.__file__))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and "survived" in run.stdout, run.stderr


def test_dlpack_exports_die_while_an_exception_propagates():
    """A capsule never taken, and tensors made from one, that die as an
    exception propagates: nothing of pinmem's may run Python code then (a
    callback into Python crashed the interpreter), and each is let go of."""
    import os
    code = textwrap.dedent("""
        import gc
        import pinmem
        from pinmem import _dlpack

        def f(*args):
            pass

        b = pinmem.empty(64)
        makers = [lambda: b.__dlpack__()]
        try:
            import numpy
            makers.append(lambda: numpy.from_dlpack(b))
        except ImportError:
            pass
        try:
            import torch
            makers.append(lambda: torch.from_dlpack(b))
        except ImportError:
            pass
        for make in makers:
            try:
                f(make(), 1 / 0)
            except ZeroDivisionError:
                pass
        gc.collect()
        assert _dlpack.live_exports() == 0, _dlpack.live_exports()
        b.close()
        print("survived", len(makers))
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(pinmem.__file__))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and "survived" in run.stdout, (run.returncode, run.stderr)


@pytest.mark.parametrize("keep", [
    "import builtins; builtins.kept = b.__dlpack__()",
    "import json; json.kept = b.__dlpack__()",
    "torch.kept = torch.utils.dlpack.from_dlpack(b)",
])
def test_dlpack_outlives_the_module(keep):
    """A capsule, or a tensor made from one, that lives until the interpreter
    shuts down: its deleter may run after pinmem's modules are cleared."""
    if "torch" in keep:
        pytest.importorskip("torch", reason="PyTorch is not installed here")
    import os
    code = ("import pinmem\n" + ("import torch, torch.utils.dlpack\n" if "torch" in keep else "")
            + "b = pinmem.empty(4096)\n" + keep + "\nprint('kept')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(pinmem.__file__))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and "kept" in run.stdout, (run.returncode, run.stderr[-2000:])


def test_numpy_scalars():
    """A numpy scalar's array interface points into a temporary array, gone
    once read: its own (read-only) buffer is taken instead, and an integer
    scalar is an int address."""
    np = optional("numpy")
    dst = bytearray(8)
    pinmem.copy(dst, np.float64(1.5))
    assert bytes(dst) == np.float64(1.5).tobytes()
    with pytest.raises(ValueError, match="read-only"):
        pinmem.copy(np.float64(0), bytearray(8))
    with pytest.raises(TypeError, match="not an address"):
        pinmem.register(np.int64(5))
    with pinmem.empty(8) as b:
        b[:] = b"ABCDEFGH"
        pinmem.copy(dst, np.uint64(b.ptr), 8)
    assert dst == b"ABCDEFGH"


def test_element_sizes_from_typestr():
    """Sizes from __array_interface__: kind U counts 4 bytes a character,
    datetimes carry a unit after their size."""
    np = optional("numpy")

    class Exported:
        def __init__(self, array):
            self.array = array

        @property
        def __array_interface__(self):
            return self.array.__array_interface__

    for array in (np.array(["ab", "cd"], dtype="<U3"),
                  np.array([1, 2], dtype="datetime64[ns]")):
        dst = bytearray(array.nbytes)
        pinmem.copy(dst, Exported(array))
        assert bytes(dst) == array.tobytes()


def test_tensor_subclasses():
    torch = optional("torch")

    class Tagged(torch.Tensor):
        pass

    src = torch.arange(4, dtype=torch.uint8).as_subclass(Tagged)
    dst = bytearray(4)
    pinmem.copy(dst, src)
    assert dst == bytes([0, 1, 2, 3])


def test_bool_sizes():
    with pytest.raises(TypeError, match="bool"):
        pinmem.copy(bytearray(4), bytearray(4), True)


def test_types_learnt_stay_bounded():
    """Each new type's handler is remembered, up to a bound."""
    from pinmem import _resolve

    dst = bytearray(4)
    for i in range(2 * _resolve._HANDLERS_MAX):
        kind = type(f"Bytes{i}", (bytearray,), {})
        pinmem.copy(dst, kind(b"abcd"))
    assert len(_resolve.handlers) <= _resolve._HANDLERS_MAX
    assert dst == b"abcd"


class _Interface:
    """Another library's host array, as its __array_interface__ describes it."""

    def __init__(self, address, shape, readonly=False):
        self._face = {"data": (address, readonly), "shape": shape, "typestr": "|u1",
                      "version": 3}

    @property
    def __array_interface__(self):
        return self._face


def test_another_librarys_interface_is_checked_as_an_address():
    with pytest.raises(ValueError, match="not mapped"):
        pinmem.copy(bytearray(16), _Interface(0x1000, (16,)))
    with pytest.raises(ValueError, match="gives no address and shape"):
        pinmem.copy(bytearray(16), _Interface(0x1000, (1.5,)))
    with pytest.raises(ValueError, match="gives no address and shape"):
        pinmem.copy(bytearray(16), _Interface(0x1000, (-1,)))
    with pytest.raises(ValueError, match="past the address space"):
        pinmem.copy(_Interface(0x1000, (1 << 64,)), _Interface(0x1000, (1 << 64,)))
    with pytest.raises(ValueError, match="gives no address and shape"):
        pinmem.copy(bytearray(16), _Interface("x", (16,)))


def test_an_index_that_closes_its_buffer_finds_it_closed():
    b = pinmem.empty(64)

    class Closes:
        def __index__(self):
            b.close()
            return 0

    with pytest.raises(ValueError, match="closed"):
        b[Closes()]
    b = pinmem.empty(64)
    with pytest.raises(ValueError, match="closed"):
        b[Closes()] = 1
    with pinmem.empty(64) as held:
        class ClosesDuring:
            def __index__(self):
                return 0

            def __buffer__(self, flags):  # read while the buffer is held
                held.close()
        with pytest.raises((BufferError, TypeError)):
            held[0:1] = ClosesDuring()
        assert not held.closed


def test_small_buffer_cases():
    with pinmem.empty(0) as empty:
        empty[:] = b""
    np = pytest.importorskip("numpy", reason="numpy is not installed here")
    with pinmem.empty(64) as b:
        assert b.numpy(np.uint8, shape=(np.int64(2), 4)).shape == (2, 4)
    with pytest.raises(TypeError, match="writable buffer protocol"):
        pinmem.register("abc")

