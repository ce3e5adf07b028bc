"""How float32 matrix products run: plain float32, on a GPU's TF32 tensor cores, or with float16
operands and float32 sums; chosen once per process, before the first product.

The run states its choice (``--precision``; the ``placement: ...`` line says which, and why):
precision is never a silent default. ``fp16``'s float16 products themselves are
:mod:`minitfm.speed.mixed`'s; here is only the choice, and what it takes of CuPy.
"""

from __future__ import annotations

import numpy

from minitfm import backend
from minitfm.backend import BackendError

__all__ = ["PRECISIONS", "TF32_CAPABILITY", "precision", "set_precision"]

PRECISIONS = ("fp32", "tf32", "fp16")
TF32_CAPABILITY = 80        # compute capability 8.0 (Ampere) and later have TF32 tensor cores
_precision = "fp32"


def precision() -> str:
    """The precision :func:`set_precision` chose (``fp32`` before it is called)."""
    return _precision


def set_precision(choice: str | None = None) -> tuple[str, str]:
    """Choose how float32 matrix products run, before the first one; return ``(precision, why)``.

    ``fp32``: plain float32 products. ``tf32``: on CuPy, float32 products on the GPU's TF32
    tensor cores (each operand rounded to a 10-bit mantissa, sums in float32), set with
    ``cupy._core.set_compute_type``. CuPy applies it to the products it hands to one cuBLAS
    GEMM: ``dot``, ``tensordot`` and ``matmul`` of 2-D arrays (every linear layer and the output
    projection); a batched ``matmul`` (attention's ``Q K^T`` and ``P V``) stays float32. None:
    ``tf32`` on a GPU of compute capability 8.0 or higher, else ``fp32``. NumPy's products are
    float32 only, and an older GPU has no TF32: ``tf32`` there raises :class:`BackendError`.
    float64 products (gradient checks) are never affected. ``fp16``: :mod:`minitfm.speed.mixed`."""
    global _precision
    if choice not in (None, *PRECISIONS):
        why = " (NumPy has no bfloat16, CuPy's batched products none: docs/gpu.md)"
        raise BackendError(f"unknown precision {choice!r}: use {', '.join(PRECISIONS)}"
                           + (why if choice == "bf16" else ""))
    if backend.name == "numpy":
        if choice == "tf32":
            raise BackendError("tf32 runs on a GPU's tensor cores (the cupy backend, compute "
                               "capability 8.0 or higher); NumPy's products are float32: use fp32")
        _precision = choice or "fp32"
        return _precision, "NumPy: float32 only" if choice is None else "asked"
    cupy = backend.xp
    capability = int(cupy.cuda.Device().compute_capability)
    where = f"compute capability {capability // 10}.{capability % 10}"
    if choice == "tf32" and capability < TF32_CAPABILITY:
        raise BackendError(f"tf32 needs TF32 tensor cores (compute capability 8.0 or higher); "
                           f"this GPU has {where}: use fp32")
    chosen = _precision = choice or ("tf32" if capability >= TF32_CAPABILITY else "fp32")
    from cupy._core import _routines_linalg     # CuPy's home of the COMPUTE_TYPE_* constants
    compute = (_routines_linalg.COMPUTE_TYPE_TF32 if chosen == "tf32"
               else _routines_linalg.COMPUTE_TYPE_DEFAULT)
    cupy._core.set_compute_type(numpy.float32, compute)
    return chosen, f"the default on {where}" if choice is None else "asked"
