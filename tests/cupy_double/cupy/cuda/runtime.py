"""``cupy.cuda.runtime`` of the double (cupy_backends/cuda/api/runtime.pyx): the device count,
the current device, properties, memory; errors as ``CUDARuntimeError('name: text')``."""

from __future__ import annotations

from cupy.cuda import _state

cudaSuccess = 0
CUDA_R_32F = 0           # cudaDataType (library_types.h; _runtime_enum.pxd)
CUDA_R_16F = 2
cudaErrorMemoryAllocation = 2
cudaErrorInvalidDevice = 101

_ERRORS = {
    cudaErrorMemoryAllocation: ("cudaErrorMemoryAllocation", "out of memory"),
    cudaErrorInvalidDevice: ("cudaErrorInvalidDevice", "invalid device ordinal"),
}


class CUDARuntimeError(RuntimeError):
    """cupy_backends/cuda/api/runtime.pyx: ``'%s: %s' % (cudaGetErrorName, cudaGetErrorString)``."""

    def __init__(self, status):
        self.status = status
        name, text = _ERRORS.get(status, (f"cudaError{status}", "unknown error"))
        super().__init__(f"{name}: {text}")

    def __reduce__(self):
        return (type(self), (self.status,))


def _check_ordinal(device: int) -> None:
    if not 0 <= device < _state.DEVICE_COUNT:
        raise CUDARuntimeError(cudaErrorInvalidDevice)


def getDeviceCount():
    return _state.DEVICE_COUNT


def getDevice():
    return _state.current_device()


def setDevice(device):
    device = int(device)
    _check_ordinal(device)
    _state.set_current_device(device)


def deviceSynchronize():
    """Waiting for the device is not a copy: not counted."""


def getDeviceProperties(device):
    """A dict as CuPy's (``name`` as bytes); the figures of an emulated 80 GB device."""
    device = int(device)
    _check_ordinal(device)
    major, minor = divmod(_state.COMPUTE_CAPABILITY, 10)
    return {"name": b"CuPy double (emulated device)", "totalGlobalMem": _state.MEMORY,
            "multiProcessorCount": 132, "major": major, "minor": minor, "warpSize": 32,
            "pciBusID": device + 1, "pciDeviceID": 0, "pciDomainID": 0}


def runtimeGetVersion():
    """The CUDA runtime CuPy was built with, as ``1000 * major + 10 * minor`` (12080: 12.8)."""
    return 12080


def driverGetVersion():
    """The CUDA version the driver supports, in the same form."""
    return 12080


def memGetInfo():
    """``(free, total)`` bytes of the current device."""
    device = _state.current_device()
    return _state.MEMORY - _state.used(device), _state.MEMORY
