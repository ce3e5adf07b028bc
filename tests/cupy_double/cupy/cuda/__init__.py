"""``cupy.cuda`` of the double: devices (cupy/cuda/device.pyx), streams (cupy/cuda/stream.pyx),
``runtime``, ``memory``; ``cupy.cuda.nccl`` is a submodule imported on demand, as CuPy's is."""

from __future__ import annotations

import importlib
import itertools
import threading

from cupy import _double
from cupy.cuda import _state, memory, runtime
from cupy.cuda.memory import MemoryPool, OutOfMemoryError  # noqa: F401


def __getattr__(name):
    # cupy.cuda.MemoryPointer: the class of ndarray.data (defined with the array)
    if name == "MemoryPointer":
        from cupy._core import MemoryPointer
        return MemoryPointer
    if name == "cublas":        # cupy/cuda/__init__.py: imported on demand
        return importlib.import_module("cupy.cuda.cublas")
    raise AttributeError(f"module 'cupy.cuda' has no attribute {name!r}")


def is_available():
    return _state.DEVICE_COUNT > 0


def get_device_id():
    return runtime.getDevice()


def get_cublas_handle():
    """cupy/cuda/device.pyx get_cublas_handle(): the current device's cuBLAS handle."""
    return importlib.import_module("cupy.cuda.cublas").HANDLE


class Device:
    """cupy/cuda/device.pyx Device(device=None): ``id``; ``use()`` and ``with Device(i):`` make
    it current (an invalid ordinal raises ``CUDARuntimeError`` there, not in the constructor)."""

    def __init__(self, device=None):
        self.id = runtime.getDevice() if device is None else int(device)
        self._previous = []

    def __int__(self):
        return self.id

    def __enter__(self):
        self._previous.append(runtime.getDevice())
        if self.id != self._previous[-1]:
            runtime.setDevice(self.id)
        return self

    def __exit__(self, *args):
        runtime.setDevice(self._previous.pop())

    def __repr__(self):
        return "<CUDA Device %d>" % self.id

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def use(self):
        runtime.setDevice(self.id)

    def synchronize(self):
        runtime.deviceSynchronize()

    @property
    def compute_capability(self):
        properties = runtime.getDeviceProperties(self.id)
        return f"{properties['major']}{properties['minor']}"


_stream_ptrs = itertools.count(0x5000)
_local = threading.local()


class Stream:
    """cupy/cuda/stream.pyx Stream(null=False, non_blocking=False, ptds=False, priority=None):
    ``ptr`` (0 for the null stream), ``use()``, ``with stream:``, ``synchronize()``."""

    null = None   # set below

    # cupy/cuda/stream.pyx: priority= is new in CuPy 14
    if _double.RULES >= 14:
        def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
            self._init(null, ptds)
    else:
        def __init__(self, null=False, non_blocking=False, ptds=False):
            self._init(null, ptds)

    def _init(self, null, ptds):
        self.ptr = 0 if null else (1 if ptds else next(_stream_ptrs))
        self.device_id = -1 if null else runtime.getDevice()
        self._previous = []

    def __enter__(self):
        self._previous.append(get_current_stream())
        self.use()
        return self

    def __exit__(self, *args):
        self._previous.pop().use()

    def use(self):
        _local.stream = self
        return self

    def synchronize(self):
        runtime.deviceSynchronize()

    def __repr__(self):
        return f"<Stream {self.ptr} (device {self.device_id})>"


Stream.null = Stream(null=True)


def get_current_stream(device_id=-1):
    return getattr(_local, "stream", Stream.null)
