"""``cupy._core._routines_linalg`` of the double: the matrix products ``dot`` and ``matmul``,
and the compute type of floating-point products (cupy/_core/_routines_linalg.pyx and .pxd,
v14.2.0; v13.6.0 where it differs).

The compute type: ``set_compute_type(dtype, compute_type)`` and ``get_compute_type(dtype)``, with
CuPy's constants (``COMPUTE_TYPE_*``, a ``cpdef enum`` of the .pxd), checks, warning and
messages; an unset type is decided at the first ``get_compute_type`` of its dtype, from
``CUPY_TF32`` (read then, once). Under ``COMPUTE_TYPE_TF32`` a float32 product that CuPy runs
through ``tensordot_core`` (``dot``, ``tensordot``, ``matmul`` of at most 2-D operands, and
``dot`` of N-D ones; not a product of two vectors, which is a reduction kernel) runs on TF32
tensor cores: the double rounds each operand to TF32's 10-bit mantissa (to nearest) and
accumulates in float32, and counts it (``tf32_products``; one in plain float32 counts
``fp32_products``). A batched ``matmul`` (an operand of
3 or more dimensions) goes through cuBLAS's ``gemmStridedBatchedEx`` with float32 compute: no
TF32, whatever the compute type.
"""

from __future__ import annotations

import os
import warnings

import numpy

from cupy import _double
from cupy._core import _SCALAR_TYPES, _array_arg, _out_arg, _wrap, ndarray

# cupy/_core/_routines_linalg.pxd: cpdef enum
COMPUTE_TYPE_TBD = 0
COMPUTE_TYPE_DEFAULT = 1   # default
COMPUTE_TYPE_PEDANTIC = 2  # disable algorithmic optimizations
COMPUTE_TYPE_FP16 = 3      # allow converting inputs to FP16
COMPUTE_TYPE_FP32 = 4      # allow converting inputs to FP32
COMPUTE_TYPE_FP64 = 5      # allow converting inputs to FP64
COMPUTE_TYPE_BF16 = 6      # allow converting inputs to BF16
COMPUTE_TYPE_TF32 = 7      # allow converting inputs to TF32

# one entry per dtype: bfloat16 (14 only), float16, float32, float64
_INDEX = {"e": 1, "f": 2, "F": 2, "d": 3, "D": 3} if _double.RULES >= 14 else \
    {"e": 0, "f": 1, "F": 1, "d": 2, "D": 2}
_compute_types = [COMPUTE_TYPE_TBD] * (max(_INDEX.values()) + 1)


def to_compute_type_index(dtype):
    dtype_char = numpy.dtype(dtype).char
    if dtype_char in _INDEX:
        return _INDEX[dtype_char]
    if _double.RULES >= 14 and dtype.name == "bfloat16":   # `dtype` as given: a type has no name
        return 0
    raise TypeError("dtype is not supported: {}".format(dtype))


def set_compute_type(dtype, compute_type):
    if compute_type in (COMPUTE_TYPE_TBD, COMPUTE_TYPE_DEFAULT, COMPUTE_TYPE_PEDANTIC,
                        COMPUTE_TYPE_FP16, COMPUTE_TYPE_FP32, COMPUTE_TYPE_FP64):
        _compute_types[to_compute_type_index(dtype)] = compute_type
    elif compute_type in (COMPUTE_TYPE_BF16, COMPUTE_TYPE_TF32):
        from cupy.cuda import Device
        if int(Device().compute_capability) >= 80:
            _compute_types[to_compute_type_index(dtype)] = compute_type
        else:
            warnings.warn("COMPUTE_TYPE_BF16 and COMPUTE_TYPE_TF32 are only available on GPUs "
                          "with compute capability 8.0 or higher. COMPUTE_TYPE_DEFAULT will be "
                          "used instead.")
            _compute_types[to_compute_type_index(dtype)] = COMPUTE_TYPE_DEFAULT
    else:
        raise ValueError("Unknown compute type: {}".format(compute_type))


def get_compute_type(dtype):
    index = to_compute_type_index(dtype)
    if _compute_types[index] == COMPUTE_TYPE_TBD:
        compute_type = COMPUTE_TYPE_DEFAULT
        if numpy.dtype(dtype).char in "fF" and int(os.getenv("CUPY_TF32", "0")) > 0:
            compute_type = COMPUTE_TYPE_TF32
        set_compute_type(dtype, compute_type)
    return _compute_types[index]


def _tf32(host: numpy.ndarray) -> numpy.ndarray:
    """float32 values rounded to TF32 (8-bit exponent, 10-bit mantissa), to nearest even."""
    bits = numpy.ascontiguousarray(host).view(numpy.uint32)
    odd = (bits >> numpy.uint32(13)) & numpy.uint32(1)
    rounded = (bits + numpy.uint32(0xFFF) + odd) & numpy.uint32(0xFFFFE000)
    return rounded.view(numpy.float32).reshape(host.shape)


def core_operands(a: ndarray, b: ndarray):
    """The NumPy operands of a product CuPy runs through ``tensordot_core`` (cuBLAS GEMM with
    the compute type of its result's dtype): rounded to TF32 under ``COMPUTE_TYPE_TF32``; float16
    ones as float32 (``tensordot_core_v11``: ``gemmEx`` with float16 operands and
    ``CUBLAS_COMPUTE_32F``: products summed in float32; the caller rounds the result to float16)."""
    result = numpy.result_type(a.dtype, b.dtype)
    if result == numpy.float16 and not a.ndim == b.ndim == 1:
        _double.record("fp16_products", "float16 GEMM, float32 sums")
        return a._a.astype(numpy.float32), b._a.astype(numpy.float32)
    if a.ndim == b.ndim == 1 or result != numpy.float32:
        return a._a, b._a
    if get_compute_type(result) != COMPUTE_TYPE_TF32:
        _double.record("fp32_products", "float32 GEMM")
        return a._a, b._a
    _double.record("tf32_products", "TF32 GEMM")
    return _tf32(a._a.astype(numpy.float32)), _tf32(b._a.astype(numpy.float32))


def dot(a, b, out=None):
    """cupy/_core/_routines_linalg.pyx dot: ``out`` must have the result's dtype
    (``ValueError('Not supported dtype combination.')``) and be C-contiguous."""
    a, b = _array_arg(a), _array_arg(b, "b")
    result_type = numpy.result_type(a.dtype, b.dtype)
    if out is None:
        return _wrap(numpy.dot(*core_operands(a, b)).astype(result_type, copy=False))
    out = _out_arg(out)
    if numpy.result_type(a.dtype, b.dtype) != out.dtype:
        raise ValueError("Not supported dtype combination.")
    if not out._a.flags.c_contiguous:
        raise ValueError("Output array must be C-contiguous")
    result = numpy.dot(*core_operands(a, b)).astype(result_type, copy=False)
    if result.size != out.size:
        raise ValueError("Output array has an invalid size")
    out._a[...] = numpy.reshape(result, out.shape)
    _double.launch()
    return out


class _MatMul:
    """``cupy.matmul``, a generalised ufunc (cupy/_core/_gufuncs.py _GUFunc.__call__): keywords
    ``axes, axis, keepdims, casting, dtype, signature, order, out`` (an unknown one: a TypeError
    on 14, ``RuntimeError('Unknown kwargs ...')`` on 13.6.0); scalar operands refused
    (cupy/_core/_routines_linalg.pyx matmul); ``out`` a cupy.ndarray or a tuple of them.
    Operands of at most 2 dimensions go through ``dot`` (the compute type applies), others
    through a batched GEMM in float32."""

    __name__ = "matmul"
    nin, nout, nargs = 2, 1, 3

    if _double.RULES >= 14:
        def __call__(self, *args, axes=None, axis=None, keepdims=False, casting="same_kind",
                     dtype=None, signature=None, order="K", out=None):
            return self._call(args, axes, axis, keepdims, casting, dtype, signature, order, out)
    else:
        def __call__(self, *args, **kwargs):
            out = kwargs.pop("out", None)
            axes = kwargs.pop("axes", None)
            axis = kwargs.pop("axis", None)
            order = kwargs.pop("order", "K")
            dtype = kwargs.pop("dtype", None)
            keepdims = kwargs.pop("keepdims", False)
            signature = kwargs.pop("signature", None)
            casting = kwargs.pop("casting", "same_kind")
            if len(kwargs) > 0:
                raise RuntimeError("Unknown kwargs {}".format(" ".join(kwargs.keys())))
            return self._call(args, axes, axis, keepdims, casting, dtype, signature, order, out)

    def _call(self, args, axes, axis, keepdims, casting, dtype, signature, order, out):
        if len(args) != 2:
            raise ValueError("According to `signature`, `func` requires 2 arguments, but %s "
                             "given" % len(args))
        for x in args:
            if not isinstance(x, ndarray) and (type(x) in _SCALAR_TYPES or
                                               isinstance(x, numpy.generic)):
                raise ValueError("Scalar operands are not allowed, use '*' instead")
        a, b = (_array_arg(x, "x") for x in args)
        if a.ndim == 0 or b.ndim == 0:
            raise ValueError("Scalar operands are not allowed, use '*' instead")
        if out is not None and not isinstance(out, tuple):
            if not isinstance(out, ndarray):
                raise TypeError("`out` must be a tuple or `cupy.ndarray`")
            out = (out,)
        extra = {k: v for k, v in (("axes", axes), ("axis", axis), ("dtype", dtype),
                                   ("signature", signature)) if v is not None}
        if keepdims:
            extra["keepdims"] = keepdims
        operands = core_operands(a, b) if max(a.ndim, b.ndim) <= 2 else (a._a, b._a)
        result_type = numpy.result_type(a.dtype, b.dtype)
        if out is not None:
            target = _out_arg(out[0])
            target._a[...] = numpy.matmul(*operands, casting=casting, order=order,
                                          **extra).astype(result_type, copy=False)
            _double.launch()
            return target
        return _wrap(numpy.matmul(*operands, casting=casting, order=order,
                                  **extra).astype(result_type, copy=False))

    def __repr__(self):
        return "<cupy._core._gufuncs._GUFunc matmul>"


matmul = _MatMul()
