"""What every pinmem object that holds a resource does with close()."""


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
