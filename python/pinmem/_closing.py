"""What every pinmem object that holds a resource does with close()."""

import os


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
    a failure has nowhere to go and is dropped."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
