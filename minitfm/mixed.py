"""Mixed precision (``--precision fp16``): float16 operands in the 2-D products, float32 for the rest.

A GPU's tensor cores multiply float16 matrices many times faster than float32 ones, summing the
products in float32. Mixed precision (Micikevicius et al., "Mixed Precision Training", 2018) uses
them where the work is and keeps float32 wherever precision matters:

- the products of every linear layer and of the output projection (``layers/linear.py``) take
  float16 copies of their two operands and sum in float32 (on CuPy: cuBLAS ``gemmEx`` with
  float16 operands and ``CUBLAS_COMPUTE_32F``); their float16 result becomes float32 again at
  the bias (or a cast), so the activations between layers stay float32;
- the float16 copy of the parameters is made once per update, for the whole flat buffer
  (:func:`half_copies`), from the float32 *master* parameters, which Adam updates with float32
  gradients and moments;
- softmax, LayerNorm's statistics, the loss and its gradient, and attention's batched products
  stay float32 (CuPy would run a batched float16 product in float32 anyway, after copying both
  operands: ``cupy/_core/_routines_linalg.pyx``, ``matmul``);
- gradients too small for float16 (below 6e-8) would vanish in the products of the backward
  pass, so the loss is multiplied by a large *loss scale* first and the gradients divided by it
  after (``minitfm.gradscale.LossScaler``).

On NumPy the same arithmetic runs, slowly: the float16 operands are multiplied as float32 and the
result rounded to float16, which is what a float32-accumulating GEMM computes (up to the order of
its sums). float64 arrays (gradient checks) are never touched.
"""

from __future__ import annotations

import contextlib
import warnings

from minitfm import backend

__all__ = ["enabled", "half", "half_copies", "half_of", "matmul", "HALF"]

HALF = "float16"
_copies: list = []       # (float32 master buffer, its float16 copy) of the update under way


def enabled(*arrays) -> bool:
    """Whether products of ``arrays`` run in float16: ``--precision fp16`` and float32 arrays."""
    return backend.precision() == "fp16" and all(a.dtype == "float32" for a in arrays)


def half(a):
    """``a`` cast to float16; values past float16's range become Inf (an overflow the loss scaler
    then sees: NumPy's warning about it is silenced, as the GPU gives none)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)     # "overflow encountered in cast"
        return a.astype(HALF)


@contextlib.contextmanager
def half_copies(params):
    """Within the block, the float16 copy of ``params`` (a flat buffer: one cast) stands in for
    each of its arrays in the products (:func:`half_of`). The parameters must not change inside."""
    buffer = getattr(params, "buffer", None)
    if not enabled() or buffer is None or buffer.dtype != "float32":
        yield
        return
    _copies.append((buffer, half(buffer)))
    try:
        yield
    finally:
        _copies.pop()


def _address(array) -> int:
    data = array.data
    return data.ptr if hasattr(data, "ptr") else array.__array_interface__["data"][0]


def _view_in_copy(w):
    """The float16 copy's view of ``w`` when ``w`` is a C-contiguous view of the master buffer."""
    if not _copies or not w.flags.c_contiguous:
        return None
    master, copy = _copies[-1]
    offset, rest = divmod(_address(w) - _address(master), master.itemsize)
    if rest or offset < 0 or offset + w.size > master.size:
        return None
    return copy[offset:offset + w.size].reshape(w.shape)


def half_of(w):
    """``w`` (a parameter, or its transpose: the tied output projection reads E^T) in float16:
    a view of the update's copy (:func:`half_copies`), else a cast."""
    transposed = not w.flags.c_contiguous and w.T.flags.c_contiguous
    view = _view_in_copy(w.T if transposed else w)
    if view is None:
        return half(w)
    return view.T if transposed else view


def matmul(a, b):
    """``a @ b`` of 2-D float16 arrays, summed in float32, rounded to float16."""
    if backend.is_gpu():
        return a @ b                     # cuBLAS gemmEx: float16 operands, CUBLAS_COMPUTE_32F
    return half(a.astype("float32") @ b.astype("float32"))
