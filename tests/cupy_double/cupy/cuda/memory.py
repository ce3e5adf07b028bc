"""``cupy.cuda.memory`` of the double (cupy/cuda/memory.pyx): the out-of-memory error and the
default pool's accounting."""

from __future__ import annotations

from cupy.cuda import _state


class OutOfMemoryError(MemoryError):
    """cupy/cuda/memory.pyx OutOfMemoryError(size, total, limit=0), with its message."""

    def __init__(self, size, total, limit=0):
        self._size, self._total, self._limit = size, total, limit
        if limit == 0:
            msg = "Out of memory allocating {:,} bytes".format(size)
            if total != -1:
                msg += " (allocated so far: {:,} bytes).".format(total)
        else:
            msg = ("Out of memory allocating {:,} bytes (allocated so far: {:,} bytes, "
                   "limit set to: {:,} bytes).".format(size, total, limit))
        super().__init__(msg)

    def __reduce__(self):
        return (type(self), (self._size, self._total, self._limit))


class MemoryPool:
    """The default pool's figures: what the live arrays of the current device hold (the double
    frees a block as soon as its last array is gone, so used == total)."""

    def used_bytes(self):
        return _state.used(_state.current_device())

    def total_bytes(self):
        return _state.used(_state.current_device())

    def free_bytes(self):
        return 0

    def free_all_blocks(self, stream=None):
        """Nothing is held back: nothing to free."""


_default_pool = MemoryPool()


def get_default_memory_pool():
    return _default_pool
