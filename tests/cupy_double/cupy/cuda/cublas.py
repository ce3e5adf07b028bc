"""``cupy.cuda.cublas`` of the double (cupy/cuda/__init__.py imports it on demand from
cupy_backends/cuda/libs/cublas.pyx): ``gemmEx`` with CuPy's parameters and cuBLAS's meaning,
emulated over the double's device memory, and the enum values it takes (cublas.pxd; cuBLAS's own
numbers, ``cublas_api.h``).

``gemmEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype,
ldc, computeType, algo)``: C = alpha op(A) op(B) + beta C in column-major order (cuBLAS's), A, B,
C device pointers into live arrays (looked up as NCCL's buffers are), alpha and beta host
pointers to numbers of the compute type. The double computes in float32 (``CUBLAS_COMPUTE_32F``:
float16 operands are summed in float32) and writes C in its own type; each call is one launch,
and one with float16 operands counts in ``fp16_products``."""

from __future__ import annotations

import ctypes

import numpy

from cupy import _double
from cupy.cuda import _state, runtime

CUBLAS_OP_N = 0
CUBLAS_OP_T = 1
CUBLAS_GEMM_DEFAULT = -1
CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99
CUBLAS_COMPUTE_32F = 68

_TYPES = {runtime.CUDA_R_16F: numpy.float16, runtime.CUDA_R_32F: numpy.float32}
HANDLE = 0xB1A5          # the current device's handle (cupy.cuda.get_cublas_handle)


class CUBLASError(RuntimeError):
    """cupy_backends/cuda/libs/cublas.pyx: ``CUBLASError(status)``, its message the status name."""

    def __init__(self, status: int, name: str):
        self.status = status
        super().__init__(name)


def _matrix(ptr: int, dtype, rows: int, cols: int, ld: int) -> numpy.ndarray:
    """The column-major ``rows x cols`` matrix at device address ``ptr`` (leading dimension
    ``ld``), as a writable view of the double's memory."""
    if ld < max(1, rows):
        raise CUBLASError(7, "CUBLAS_STATUS_INVALID_VALUE")
    allocation, offset = _state.lookup(int(ptr))
    if allocation.device_id != _state.current_device():
        raise CUBLASError(13, "CUBLAS_STATUS_EXECUTION_FAILED")
    count = (cols - 1) * ld + rows if rows and cols else 0
    flat = allocation.view(offset, count, dtype)
    size = numpy.dtype(dtype).itemsize
    return numpy.lib.stride_tricks.as_strided(flat, (rows, cols), (size, ld * size))


def gemmEx(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype,
           ldc, computeType, algo):
    if handle != HANDLE:
        raise CUBLASError(1, "CUBLAS_STATUS_NOT_INITIALIZED")
    if computeType != CUBLAS_COMPUTE_32F or not {Atype, Btype, Ctype} <= set(_TYPES) or \
            transa not in (CUBLAS_OP_N, CUBLAS_OP_T) or transb not in (CUBLAS_OP_N, CUBLAS_OP_T):
        raise CUBLASError(15, "CUBLAS_STATUS_NOT_SUPPORTED")
    a = _matrix(A, _TYPES[Atype], *((m, k) if transa == CUBLAS_OP_N else (k, m)), lda)
    b = _matrix(B, _TYPES[Btype], *((k, n) if transb == CUBLAS_OP_N else (n, k)), ldb)
    c = _matrix(C, _TYPES[Ctype], m, n, ldc)
    a = a if transa == CUBLAS_OP_N else a.T
    b = b if transb == CUBLAS_OP_N else b.T
    scale = ctypes.c_float.from_address(int(alpha)).value
    keep = ctypes.c_float.from_address(int(beta)).value
    product = scale * (a.astype(numpy.float32) @ b.astype(numpy.float32))
    if keep:
        product += keep * c.astype(numpy.float32)
    c[...] = product
    if runtime.CUDA_R_16F in (Atype, Btype):
        _double.record("fp16_products", "float16 GEMM, float32 sums")
    _double.launch("gemmEx")
