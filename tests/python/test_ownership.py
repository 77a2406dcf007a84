"""Objects that own memory or a handle: never two owners of one (no copies,
no pickles), never destroyed under a call in another thread, and closed by
the garbage collector even while a thread holds pinmem's locks."""

import copy
import gc
import pickle
import threading
import time

import pytest

import pinmem
from pinmem import _register


def _owners():
    made = [pinmem.empty(64), pinmem.device_empty(64), pinmem.Pool(), pinmem.Stream(),
            pinmem.register(bytearray(4096))]
    return made


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
def test_owners_are_neither_copied_nor_pickled(how):
    made = _owners()
    try:
        for obj in made:
            with pytest.raises(TypeError, match=type(obj).__name__):
                if how == "copy":
                    copy.copy(obj)
                elif how == "deepcopy":
                    copy.deepcopy(obj)
                else:
                    pickle.dumps(obj)
    finally:
        for obj in made:
            obj.close()


@pytest.mark.parametrize("kind", ["pool", "stream"])
def test_close_while_another_thread_uses_it(kind):
    """A close while a call holds the handle raises BufferError; the call
    goes on, and a close after it succeeds."""
    obj = pinmem.Pool() if kind == "pool" else pinmem.Stream()
    handle = obj._hold("test")
    with pytest.raises(BufferError, match=f"cannot close the {kind}"):
        obj.close()
    assert not obj.closed and obj.handle == handle
    obj._let_go()
    obj.close()
    assert obj.closed
    with pytest.raises(ValueError, match="closed"):
        obj._hold("test")


def test_a_kept_pool_cannot_be_closed():
    # as pinmem.torch.install() keeps the pool PyTorch's frees go back to
    pool = pinmem.Pool()
    pool._keep("the test's allocator")
    with pytest.raises(BufferError, match="the test's allocator uses it"):
        pool.close()
    assert not pool.closed
    pool.alloc(64).close()
    closed = pinmem.Pool()
    closed.close()
    with pytest.raises(ValueError, match="closed"):
        closed._keep("the test's allocator")


def test_a_stream_subclass_is_held_by_copies():
    from pinmem._stream import stream_use

    class Tagged(pinmem.Stream):
        pass

    s = Tagged()
    handle, let_go = stream_use(s, "test")
    assert handle == s.handle and let_go is not None
    with pytest.raises(BufferError):
        s.close()
    let_go()
    s.close()


@pytest.mark.parametrize("kind", ["pool", "stream"])
def test_close_races_calls(kind):
    """Threads use the object while the main thread closes it: each call
    either works or raises ValueError (closed); nothing crashes."""
    for _ in range(20):
        obj = pinmem.Pool() if kind == "pool" else pinmem.Stream()
        src, dst = bytearray(b"x" * 4096), bytearray(4096)
        stop = threading.Event()
        unexpected = []

        def use():
            while not stop.is_set():
                try:
                    if kind == "pool":
                        obj.alloc(256).close()
                    else:
                        pinmem.copy(dst, src, stream=obj)
                except ValueError:
                    return  # closed
                except Exception as e:  # pragma: no cover - the failure shown
                    unexpected.append(e)
                    return

        threads = [threading.Thread(target=use) for _ in range(4)]
        for t in threads:
            t.start()
        # Four threads may keep it in use for good: closes are tried a while,
        # then the threads stop and the close must succeed.
        deadline = time.monotonic() + 0.05
        while not obj.closed and time.monotonic() < deadline:
            try:
                obj.close()
            except BufferError:
                pass
        stop.set()
        for t in threads:
            t.join()
        obj.close()
        assert obj.closed
        assert not unexpected, unexpected


def test_collected_while_a_thread_holds_the_lock():
    """A Registration in a reference cycle, collected while its module's
    lock is held (as when a collection runs inside a copy's bookkeeping),
    closes without waiting for that lock."""
    done = threading.Event()

    def collect_under_the_lock():
        with _register._lock:
            r = pinmem.register(bytearray(4096))
            cycle = [r]
            cycle.append(cycle)
            del r, cycle
            gc.collect()
        done.set()

    t = threading.Thread(target=collect_under_the_lock, daemon=True)
    t.start()
    t.join(timeout=30)
    assert done.is_set(), "the collection waited for the lock its own thread held"
