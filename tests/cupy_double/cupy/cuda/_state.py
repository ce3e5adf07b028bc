"""The emulated devices: which is current, how many there are, their memory.

``CUPY_DOUBLE_DEVICES`` (default 1) devices, each with ``CUPY_DOUBLE_MEMORY`` bytes (default
16 GiB) and compute capability ``CUPY_DOUBLE_COMPUTE_CAPABILITY`` (default 90, i.e. 9.0). Allocations are accounted per device in blocks of 512 bytes, as CuPy's memory pool
rounds them (cupy/cuda/memory.pyx ALLOCATION_UNIT_SIZE), and handed fake device addresses that
are never reused, so that ``ndarray.data.ptr`` names one allocation and offset.
"""

from __future__ import annotations

import bisect
import os
import threading
import weakref

UNIT = 512
_BASE = 0x7F0000000000     # where the fake device addresses start


def _int_env(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ImportError(f"{name}={value!r}: expected an integer") from None


DEVICE_COUNT = _int_env("CUPY_DOUBLE_DEVICES", 1)
MEMORY = _int_env("CUPY_DOUBLE_MEMORY", 16 << 30)
COMPUTE_CAPABILITY = _int_env("CUPY_DOUBLE_COMPUTE_CAPABILITY", 90)   # 90: 9.0, an H100's

_local = threading.local()
_used = [0] * max(DEVICE_COUNT, 1)
_next_ptr = [_BASE]
_starts: list[int] = []                       # sorted device addresses of live allocations
_allocations: dict[int, weakref.ref] = {}     # address -> allocation
_lock = threading.Lock()


def current_device() -> int:
    return getattr(_local, "device", 0)


def set_current_device(device_id: int) -> None:
    _local.device = device_id


def used(device_id: int) -> int:
    return _used[device_id]


def allocate(nbytes: int, device_id: int) -> int:
    """Account ``nbytes`` on the device; a fake device address. Over the device's memory:
    ``OutOfMemoryError`` as CuPy's pool raises it (cupy/cuda/memory.pyx)."""
    size = -(-nbytes // UNIT) * UNIT
    with _lock:
        check_fits(nbytes, device_id)
        _used[device_id] += size
        ptr = _next_ptr[0]
        _next_ptr[0] += max(size, UNIT)
    return ptr


def check_fits(nbytes: int, device_id: int) -> None:
    """``OutOfMemoryError`` where ``nbytes`` do not fit beside what the device holds: asked
    before the host array behind an allocation is made, so that a refused size costs nothing."""
    size = -(-nbytes // UNIT) * UNIT
    if _used[device_id] + size > MEMORY:
        from cupy.cuda.memory import OutOfMemoryError
        raise OutOfMemoryError(size, _used[device_id])


def register(allocation) -> None:
    with _lock:
        bisect.insort(_starts, allocation.ptr)
        _allocations[allocation.ptr] = weakref.ref(allocation)


def release(ptr: int, nbytes: int, device_id: int) -> None:
    size = -(-nbytes // UNIT) * UNIT
    with _lock:
        _used[device_id] -= size
        _allocations.pop(ptr, None)
        at = bisect.bisect_left(_starts, ptr)
        if at < len(_starts) and _starts[at] == ptr:
            del _starts[at]


def lookup(ptr: int):
    """The live allocation holding device address ``ptr``, and the offset in it."""
    with _lock:
        at = bisect.bisect_right(_starts, ptr) - 1
        if at >= 0:
            allocation = _allocations[_starts[at]]()
            if allocation is not None and ptr < allocation.ptr + max(allocation.nbytes, 1):
                return allocation, ptr - allocation.ptr
    raise ValueError(f"0x{ptr:x} is not a device pointer of a live array (an illegal address)")
