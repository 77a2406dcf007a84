"""What every pinmem object that holds a resource does with close(), with
copies of itself, and with calls in other threads that use its handle."""

import os
import threading


def free_in_forked_child(lock):
    """lock, made free again in each child of fork: a thread of the parent
    may have held it at the fork, and the child's finalizers take it as
    they let go of the objects the child inherited (pinmem.h, pm_init)."""
    reinit = getattr(lock, "_at_fork_reinit", None)  # CPython's, since 3.9
    if reinit is not None:
        os.register_at_fork(after_in_child=reinit)
    return lock


class Closing:
    """close() when a ``with`` block ends, and on garbage collection, where
    a failure has nowhere to go and is dropped. Neither copied nor pickled:
    two objects would each give back the one resource."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __copy__(self):
        raise TypeError(f"a pinmem.{type(self).__qualname__} owns what it holds and cannot be "
                        f"copied; copy its bytes with pinmem.copy instead")

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce_ex__(self, protocol):
        raise TypeError(f"a pinmem.{type(self).__qualname__} holds memory or a handle of this "
                        f"process and cannot be pickled")


# Re-entrant: a garbage collection that runs while a thread holds it may
# close an object of the same kind on that thread.
_users_lock = free_in_forked_child(threading.RLock())


class Handled(Closing):
    """An object whose handle (self._handle, None once closed) calls use
    while other threads may close it. Each such call holds the object
    (_hold() ... _let_go()); close() while any does raises BufferError, as a
    Buffer's does while a copy uses it, instead of destroying the handle
    under the call."""

    _users = 0
    _noun = "object"
    _kept_by = None

    def _hold(self, what):
        """The handle, held until _let_go(); ValueError once closed."""
        with _users_lock:
            handle = self._handle
            if handle is None:
                raise ValueError(f"{what}: the {self._noun} is closed")
            self._users += 1
        return handle

    def _let_go(self):
        with _users_lock:
            self._users -= 1

    def _keep(self, who):
        """Holds the object for good: who (named in close()'s error) keeps
        using its handle where Python cannot see it."""
        with _users_lock:
            self._hold(who)
            self._kept_by = who

    def _held(self, what):
        """``with obj._held(what) as handle:`` holds it for the block."""
        return _Holding(self, what)

    def _take_handle(self):
        """The handle for close() to destroy (None when closed already)."""
        with _users_lock:
            if self._handle is not None and self._kept_by is not None:
                raise BufferError(f"cannot close the {self._noun}: {self._kept_by} uses it "
                                  f"for the rest of the process")
            if self._handle is not None and self._users:
                raise BufferError(f"cannot close the {self._noun}: calls in other threads "
                                  f"still use it")
            handle, self._handle = self._handle, None
        return handle


class _Holding:
    """Handled._held's context (a class: a generator's costs a microsecond
    more a call)."""

    __slots__ = ("_obj", "_handle")

    def __init__(self, obj, what):
        self._handle = obj._hold(what)
        self._obj = obj

    def __enter__(self):
        return self._handle

    def __exit__(self, *exc):
        self._obj._let_go()
