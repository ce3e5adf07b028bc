"""Mixed precision (``--precision fp16``): float16 operands in the 2-D products, float32 for the
rest.

A GPU's tensor cores multiply float16 matrices many times faster than float32 ones, summing the
products in float32. Mixed precision (Micikevicius et al., "Mixed Precision Training", 2018) uses
them where the work is and keeps float32 wherever precision matters:

- the products of every linear layer and of the output projection (``speed/linear.py``, the
  float16 path of ``layers/linear.py``) take float16 copies of their two operands, sum in
  float32 and give a float32 result (on CuPy: cuBLAS ``gemmEx`` with float16 A and B, float32
  C and ``CUBLAS_COMPUTE_32F``, the call CuPy's own float16 ``dot`` makes,
  ``cupy/_core/_routines_linalg.pyx`` ``tensordot_core_v11``, but with a float32 C: no cast of the result, and dW lands in the float32 gradient buffer
  directly), so the activations between layers stay float32;
- the float16 copy of the parameters is made once per update, for the whole flat buffer
  (:func:`half_copies`), from the float32 *master* parameters, which Adam updates with float32
  gradients and moments;
- softmax, LayerNorm's statistics, the loss and its gradient, and attention's batched products
  stay float32 (CuPy would run a batched float16 product in float32 anyway, after copying both
  operands: ``cupy/_core/_routines_linalg.pyx``, ``matmul``);
- gradients too small for float16 (below 6e-8) would vanish in the products of the backward
  pass, so the loss is multiplied by a large *loss scale* first and the gradients divided by it
  after (``minitfm.gradscale.LossScaler``).

On NumPy the same arithmetic runs, slowly: the float16 operands are multiplied as float32, which
is what a float32-accumulating GEMM computes (up to the order of its sums). float64 arrays
(gradient checks) are never touched.
"""

from __future__ import annotations

import contextlib
import ctypes
import warnings
import weakref

from minitfm import backend
from minitfm.backend import products

__all__ = ["enabled", "half", "remember", "half_copies", "half_of", "matmul", "HALF"]

HALF = "float16"
_copies: list = []       # (float32 master buffer, its float16 copy) of the update under way
_companions: dict = {}   # id(array) -> (a weak reference to it, its float16 copy)


def enabled(*arrays) -> bool:
    """Whether products of ``arrays`` run in float16: ``--precision fp16`` and float32 arrays."""
    return products.precision() == "fp16" and all(a.dtype == "float32" for a in arrays)


def half(a):
    """``a`` cast to float16; values past float16's range become Inf (an overflow the loss scaler
    then sees: NumPy's warning about it is silenced, as the GPU gives none). An array a fused
    kernel wrote together with its float16 copy (:func:`remember`) gives that copy: no cast."""
    entry = _companions.get(id(a))
    if entry is not None and entry[0]() is a:
        return entry[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)     # "overflow encountered in cast"
        return a.astype(HALF)


def remember(array, copy) -> None:
    """``copy`` is ``array`` in float16, written by the kernel that wrote ``array`` (LayerNorm's
    output, the ReLU's): :func:`half` returns it while ``array`` lives. ``array`` must not change
    afterwards (those outputs are only read: the next layer's input, a cache)."""
    key = id(array)
    _companions[key] = (weakref.ref(array, lambda _, key=key: _companions.pop(key, None)), copy)


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


def matmul(a, b, out=None):
    """``a @ b`` of 2-D float16 arrays, summed in float32, a float32 result (written into
    ``out``, a float32 array or a transposed view of one, when given)."""
    if not backend.is_gpu():
        return backend.xp.matmul(a.astype("float32"), b.astype("float32"), out=out)
    if out is None:
        out = backend.xp.empty((a.shape[0], b.shape[1]), dtype="float32")
    if not out.flags.c_contiguous:          # out^T = b^T a^T, into the C-contiguous out^T
        _gemm(b.T, a.T, out.T)
    else:
        _gemm(a, b, out)
    return out


def _gemm(a, b, c) -> None:
    """c (m, n), C-contiguous float32 = a (m, k) @ b (k, n), float16, through cuBLAS ``gemmEx``.

    cuBLAS reads matrices in column-major order, where a C-contiguous (rows, cols) array is its
    (cols, rows) transpose: so it computes c^T = b^T a^T, each operand transposed or not (op T or
    N) as its memory is C- or F-contiguous (a transposed view, such as W^T in dX = dY W^T)."""
    cupy = backend.xp                       # CuPy only: cuBLAS through CuPy's binding
    cublas, runtime = cupy.cuda.cublas, cupy.cuda.runtime
    operands = []
    for x in (b, a):
        if not (x.flags.c_contiguous or x.flags.f_contiguous):
            x = cupy.ascontiguousarray(x)
        trans = cublas.CUBLAS_OP_N if x.flags.c_contiguous else cublas.CUBLAS_OP_T
        operands.append((x, trans, x.shape[1] if trans == cublas.CUBLAS_OP_N else x.shape[0]))
    (bb, trans_b, ld_b), (aa, trans_a, ld_a) = operands
    m, k = a.shape
    n = b.shape[1]
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)     # host scalars of the compute type
    cublas.gemmEx(cupy.cuda.get_cublas_handle(), trans_b, trans_a, n, m, k,
                  ctypes.addressof(one), bb.data.ptr, runtime.CUDA_R_16F, ld_b,
                  aa.data.ptr, runtime.CUDA_R_16F, ld_a, ctypes.addressof(zero),
                  c.data.ptr, runtime.CUDA_R_32F, n, cublas.CUBLAS_COMPUTE_32F,
                  cublas.CUBLAS_GEMM_DEFAULT_TENSOR_OP)
