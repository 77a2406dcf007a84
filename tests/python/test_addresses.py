"""pinmem.copy with int addresses: inside pinmem's own memory no system call
is needed; any other address is checked over its whole range (mapped, and
readable or writable as the copy needs, or inside one device allocation),
so a stray one raises instead of crashing the interpreter."""

import ctypes
import mmap
import os

import pytest

import pinmem
from pinmem import _access, _resolve

PAGE = mmap.PAGESIZE

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.restype = ctypes.c_int
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value
_PROT_NONE = 0


@pytest.fixture
def system_checks(monkeypatch):
    """Counts the checks that reach the library, as (address, nbytes)."""
    calls = []
    real = _access.problem

    def counting(address, nbytes, write, spans=None, what="pinmem.copy"):
        calls.append((address, nbytes))
        return real(address, nbytes, write, spans, what)

    monkeypatch.setattr(_access, "problem", counting)
    return calls


# Host memory is always asked about, pinmem's own included: the program may
# have made its pages inaccessible. Device memory of a live DeviceBuffer is
# asked about only where the CPU moves every byte of it (posix).
def _device_asked():
    return pinmem.backend() == "posix"


def _permissions_told():
    """Whether the library can learn what a mapping permits: it reads
    /proc/self/maps, by the kernel's PROCMAP_QUERY ioctl (Linux 6.11 and
    later) or as text."""
    return os.access("/proc/self/maps", os.R_OK)


def test_capabilities_say_whether_permissions_are_checked():
    assert pinmem.capabilities()["access_checks_permissions"] is _permissions_told()


@pytest.fixture
def permissions_known():
    """Skips where /proc/self/maps cannot be read."""
    if not _permissions_told():
        pytest.skip("/proc/self/maps cannot be read here")


def _protect(address, nbytes, prot):
    assert _libc.mprotect(address, nbytes, prot) == 0, f"mprotect: errno {ctypes.get_errno()}"


@pytest.fixture
def pages():
    """Three fresh anonymous pages (read-write), unmapped afterwards; the
    test may unmap some of them first (munmap of an unmapped page is fine)."""
    base = _libc.mmap(None, 3 * PAGE, mmap.PROT_READ | mmap.PROT_WRITE,
                      mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if base in (None, _MAP_FAILED):
        pytest.skip(f"mmap of three pages failed (errno {ctypes.get_errno()})")
    yield base
    _libc.munmap(base, 3 * PAGE)


def test_inside_live_device_memory_needs_no_system_call(system_checks):
    src = bytes(range(256)) * 4
    with pinmem.device_empty(4096) as dev:
        pinmem.copy(dev.ptr, dev.ptr + 4096 - 16, 16)  # the last bytes, to the base
        pinmem.copy(dev.ptr + 8, src, len(src))  # inside, not at the base
        out = bytearray(len(src))
        pinmem.copy(out, dev.ptr + 8, len(src))
        assert bytes(out) == src
    assert (system_checks != []) == _device_asked()


def test_inside_a_live_buffer_is_asked(system_checks):
    src = bytes(range(256)) * 4
    with pinmem.empty(4096) as b:
        pinmem.copy(b.ptr + 100, src, len(src))
        assert len(system_checks) == 1
        out = bytearray(len(src))
        pinmem.copy(out, b.ptr + 100, len(src))
        assert bytes(out) == src and len(system_checks) == 2


def test_inside_a_registration_is_asked(system_checks):
    mem = bytearray(3 * PAGE)
    try:
        reg = pinmem.register(mem)
    except pinmem.PinmemError as e:
        pytest.skip(f"registration refused here: {e}")
    with reg:
        address = reg.ptr
        pinmem.copy(address + 10, b"abc", 3)
        assert mem[10:13] == b"abc"
        assert len(system_checks) == 1
    # closed: the address is the bytearray's, asked about as before
    out = bytearray(3)
    pinmem.copy(out, address + 10, 3)
    assert out == b"abc"
    assert len(system_checks) == 2


def _address_of(obj):
    held = (ctypes.c_char * len(obj)).from_buffer(obj)
    try:
        return ctypes.addressof(held)
    finally:
        del held


def test_foreign_address_is_checked_once(system_checks):
    mem = bytearray(1000)
    address = _address_of(mem)
    pinmem.copy(address, b"x" * 1000, 1000)
    assert mem == b"x" * 1000
    assert system_checks == [(address, 1000)]  # the whole range, once


def test_just_freed_buffer_is_checked_and_refused():
    # 64 KiB: a hole too small for the interpreter's arenas or malloc's
    # mmaps to fill before the copy below
    b = pinmem.empty(1 << 16)
    address = b.ptr
    b.close()
    assert address not in _resolve.owned
    assert "not mapped" in _resolve.access_problem(address, 1 << 16, True)
    with pytest.raises(ValueError, match="not mapped"):
        pinmem.copy(address, b"x" * 64, 64)
    with pytest.raises(ValueError, match="not mapped"):
        pinmem.copy(bytearray(64), address + 128, 64)


def test_just_freed_device_buffer_is_checked():
    d = pinmem.device_empty(1 << 16)
    address = d.ptr
    d.close()
    assert address not in _resolve.owned
    if pinmem.backend() == "posix":
        with pytest.raises(ValueError, match="not mapped"):
            pinmem.copy(address, b"x" * 64, 64)


def test_unmapped_address(pages):
    _libc.munmap(pages, 3 * PAGE)
    with pytest.raises(ValueError, match="not mapped"):
        pinmem.copy(pages, b"x" * 64, 64)
    with pytest.raises(ValueError, match="not mapped"):
        pinmem.copy(bytearray(64), pages + 8, 64)


def test_range_whose_last_page_is_unmapped(pages):
    _libc.munmap(pages + 2 * PAGE, PAGE)
    pinmem.copy(pages, b"y" * (2 * PAGE), 2 * PAGE)  # the two mapped pages
    with pytest.raises(ValueError, match="not mapped"):
        pinmem.copy(pages, b"y" * (2 * PAGE + 1), 2 * PAGE + 1)
    with pytest.raises(ValueError, match="not mapped"):
        pinmem.copy(bytearray(PAGE), pages + PAGE + 100, PAGE)


def test_range_with_an_unmapped_page_inside(pages):
    # first and last page mapped, the middle one not: only a check of the
    # whole range sees it
    _libc.munmap(pages + PAGE, PAGE)
    with pytest.raises(ValueError, match="not mapped"):
        pinmem.copy(pages, b"z" * (3 * PAGE), 3 * PAGE)
    with pytest.raises(ValueError, match="not mapped"):
        pinmem.copy(bytearray(3 * PAGE), pages, 3 * PAGE)
    pinmem.copy(pages + 2 * PAGE, b"z" * PAGE, PAGE)


def test_range_past_live_device_memory_is_checked(system_checks):
    with pinmem.device_empty(PAGE) as dev:
        pinmem.copy(bytearray(16), dev.ptr + PAGE - 16, 16)
        asked = len(system_checks)
        assert asked == int(_device_asked())
        # 32 bytes from 16 before the end run past the allocation: the system
        # is asked (only asked: the next page is none of this test's)
        _resolve.access_problem(dev.ptr + PAGE - 16, 32, False)
        assert len(system_checks) == asked + 1


def test_page_the_process_may_not_touch(pages, permissions_known):
    _protect(pages + PAGE, PAGE, _PROT_NONE)
    with pytest.raises(ValueError, match="neither readable host memory"):
        pinmem.copy(bytearray(64), pages + PAGE + 8, 64)
    with pytest.raises(ValueError, match="neither writable host memory"):
        pinmem.copy(pages + PAGE, b"x" * 64, 64)
    # a range that only passes through it
    with pytest.raises(ValueError, match="neither readable"):
        pinmem.copy(bytearray(3 * PAGE), pages, 3 * PAGE)
    with pytest.raises(ValueError, match="neither writable"):
        pinmem.copy(pages + PAGE - 8, b"x" * 16, 16)
    # the pages around it are still fine
    pinmem.copy(pages + 2 * PAGE, b"v" * PAGE, PAGE)
    out = bytearray(PAGE)
    pinmem.copy(out, pages + 2 * PAGE, PAGE)
    assert out == b"v" * PAGE


def test_read_only_page(pages, permissions_known):
    pinmem.copy(pages, b"r" * PAGE, PAGE)
    _protect(pages, PAGE, mmap.PROT_READ)
    out = bytearray(PAGE)
    pinmem.copy(out, pages, PAGE)  # reading it is fine
    assert out == b"r" * PAGE
    with pytest.raises(ValueError, match="is not writable in this process"):
        pinmem.copy(pages + 16, b"x" * 16, 16)


def test_batch_element_the_process_may_not_touch(pages, permissions_known):
    _protect(pages + PAGE, PAGE, _PROT_NONE)
    out = bytearray(2 * PAGE)
    dst = _address_of(out)
    with pytest.raises(ValueError, match="element 1's source .* neither readable"):
        pinmem.copy_batch([dst, dst + PAGE], [pages, pages + PAGE], [PAGE, PAGE])
    with pytest.raises(ValueError, match="element 0's destination .* neither writable"):
        pinmem.copy_batch([pages + PAGE + 64], [dst], [64])


def _foreign_device_memory(nbytes):
    """Device memory that no pinmem object holds (as another library's):
    pm_device_alloc called directly."""
    from pinmem import _lib

    lib = _lib.load()
    d = ctypes.c_uint64()
    rc = lib.pm_device_alloc(ctypes.byref(d), nbytes)
    if rc:
        pytest.skip(f"pm_device_alloc failed ({rc})")
    return lib, d.value


def test_foreign_device_addresses(system_checks):
    n = 1 << 16
    lib, first = _foreign_device_memory(n)
    _, second = _foreign_device_memory(n)
    try:
        data = bytes(range(256)) * (n // 256)
        pinmem.copy(first, data, n)
        pinmem.copy(second + 64, first + 64, n - 64)
        out = bytearray(n)
        pinmem.copy(out, second, n)
        assert out[64:] == data[64:]
        # a batch over both allocations: each is asked about once, not each block
        blocks = 64
        step = n // blocks
        dsts = [a + i * step for a in (first, second) for i in range(blocks)]
        back = bytearray(2 * n)
        host = _address_of(back)
        system_checks.clear()
        pinmem.copy_batch([host + i * step for i in range(2 * blocks)], dsts, [step] * 2 * blocks)
        assert back[:n] == data
        assert len(system_checks) <= 4
        # past the allocation's end: refused before anything moves
        with pytest.raises((ValueError, pinmem.PinmemError)):
            pinmem.copy(bytearray(128), first + n - 64, 128)
    finally:
        lib.pm_device_free(first)
        lib.pm_device_free(second)


def test_addresses_beyond_the_address_space():
    with pytest.raises(ValueError):
        pinmem.copy((1 << 64) - 8, b"x" * 64, 64)
    with pytest.raises(ValueError):
        pinmem.copy(1 << 64, b"x", 1)


def _in_threads(worker, count):
    """Runs worker(k) for k in range(count), each on a thread of its own, all
    at once; returns what they raised."""
    import threading

    errors = []

    def run(k):
        try:
            worker(k)
        except Exception as e:  # reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_threads_make_and_free_while_others_copy():
    n = 4096
    before = len(_resolve.owned)

    def worker(seed):
        for i in range(200):
            with pinmem.empty(n) as b:
                data = bytes([(seed + i) & 0xFF]) * 64
                pinmem.copy(b.ptr + 64 * (i % 32), data, 64)
                out = bytearray(64)
                pinmem.copy(out, b.ptr + 64 * (i % 32), 64)
                assert out == data

    assert _in_threads(worker, 4) == []
    # every buffer the threads made is forgotten again, the index with it
    assert sorted(_resolve.owned) == _resolve._bases
    assert len(_resolve.owned) == before


def test_threads_check_foreign_addresses_at_once(pages, permissions_known):
    _protect(pages + PAGE, PAGE, _PROT_NONE)

    def worker(seed):
        mem = bytearray(PAGE)
        address = _address_of(mem)
        for i in range(300):
            data = bytes([(seed + i) & 0xFF]) * 64
            pinmem.copy(address + 64 * (i % 16), data, 64)
            assert mem[64 * (i % 16):64 * (i % 16) + 64] == data
            with pytest.raises(ValueError, match="neither readable"):
                pinmem.copy(bytearray(64), pages + PAGE, 64)

    assert _in_threads(worker, 8) == []


def test_a_forked_child_is_refused_cleanly(pages, permissions_known):
    """A child forked after pinmem started may not use it (pinmem.h,
    pm_init): an int address it made inaccessible raises, as any call does,
    and the interpreter lives."""
    import os

    pinmem.copy(pages, b"p" * 64, 64)  # the parent has asked before
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _protect(pages + 2 * PAGE, PAGE, _PROT_NONE)
            try:
                pinmem.copy(bytearray(64), pages + 2 * PAGE, 64)
            except pinmem.PinmemError as e:
                code = 0 if e.result == "PM_ERROR_NOT_INITIALIZED" else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    out = bytearray(64)
    pinmem.copy(out, pages + 2 * PAGE, 64)  # still readable here
