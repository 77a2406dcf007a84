"""pinmem called from Python inside a host function (pm_stream_launch_host_func,
queued through ctypes): each call the driver refuses there raises PinmemError
carrying PM_ERROR_NOT_PERMITTED, and the same calls work after it."""

import ctypes

import pinmem
from pinmem import _lib

HOST_FUNC = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def test_refused_calls_raise_inside_a_host_function():
    lib = _lib.load()
    src = pinmem.empty(4096)
    dst = bytearray(4096)
    pool = pinmem.Pool()
    calls = {
        "empty": lambda: pinmem.empty(4096),
        "copy": lambda: pinmem.copy(dst, src),
        "Pool.alloc": lambda: pool.alloc(4096),
        "stats": pinmem.stats,
        "register": lambda: pinmem.register(bytearray(8192)),
    }
    outcomes = {}

    def inside(_):
        for name, call in calls.items():
            try:
                call()
                outcomes[name] = "returned"
            except pinmem.PinmemError as e:
                outcomes[name] = e.result
            except Exception as e:  # noqa: BLE001 - any other kind fails the test below
                outcomes[name] = repr(e)

    fn = HOST_FUNC(inside)
    with pinmem.Stream() as stream:
        assert lib.pm_stream_launch_host_func(ctypes.c_void_p(stream.handle), fn, None) == 0
        stream.synchronize()
    assert outcomes == {name: "PM_ERROR_NOT_PERMITTED" for name in calls}
    src[:16] = b"after the call.."
    pinmem.copy(dst, src)
    assert bytes(dst[:16]) == b"after the call.."
    pool.alloc(4096).close()
    pool.close()
    src.close()
