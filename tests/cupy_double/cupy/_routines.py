"""The double's routines, each with the parameters of CuPy's (the conformance test compares them
with the installed ``cupy``), computed by NumPy on the arrays' host copies.

Arrays in, arrays out: a routine's array arguments must be double arrays or Python scalars and
sequences (a ``numpy.ndarray`` is refused where CuPy refuses it); reductions return 0-d arrays,
never host scalars; data-dependent shapes (``nonzero``, ``unique``, one-argument ``where``...)
are device-to-host copies and counted.
"""

from __future__ import annotations

import builtins

import numpy

from cupy import _double
from cupy._core import (_array_arg, _finish, _from_host, _garbage, _operand, _out_arg, _wrap,
                        _check_kind_sort, _reshape, _unsupported, ndarray)
from cupy._core._routines_linalg import core_operands, dot, matmul  # noqa: F401

# ---- creation (cupy/_creation/basic.py, from_data.py, ranges.py) ----------------------------


def empty(shape, dtype=float, order="C"):
    """Uninitialised: NaN-filled (integers: a garbage value), so that reads of it show."""
    return ndarray._make(_garbage(shape, dtype, order), None)


def empty_like(prototype, dtype=None, order="K", subok=None, shape=None):
    if subok is not None:
        raise TypeError("subok is not supported yet")
    prototype = _array_arg(prototype, "prototype")
    return empty(prototype.shape if shape is None else shape,
                 prototype.dtype if dtype is None else dtype, "C" if order == "K" else order)


def zeros(shape, dtype=float, order="C"):
    return _wrap(numpy.zeros(shape, dtype=dtype, order=order))


def ones(shape, dtype=float, order="C"):
    return _wrap(numpy.ones(shape, dtype=dtype, order=order))


def full(shape, fill_value, dtype=None, order="C"):
    if isinstance(fill_value, ndarray):
        fill_value = fill_value._a            # a device-to-device copy
    elif isinstance(fill_value, numpy.ndarray):
        raise _unsupported(fill_value)
    return _wrap(numpy.full(shape, fill_value, dtype=dtype, order=order))


def _like(a, dtype, order, subok, shape, fill):
    if subok is not None:
        raise TypeError("subok is not supported yet")
    a = _array_arg(a)
    result = empty_like(a, dtype, order, None, shape)
    result._a[...] = fill
    _double.launch()
    return result


def zeros_like(a, dtype=None, order="K", subok=None, shape=None):
    return _like(a, dtype, order, subok, shape, 0)


def ones_like(a, dtype=None, order="K", subok=None, shape=None):
    return _like(a, dtype, order, subok, shape, 1)


def full_like(a, fill_value, dtype=None, order="K", subok=None, shape=None):
    if isinstance(fill_value, ndarray):
        fill_value = fill_value._a
    return _like(a, dtype, order, subok, shape, fill_value)


def arange(start, stop=None, step=1, dtype=None):
    for v in (start, stop, step):
        if isinstance(v, (ndarray, numpy.ndarray)):
            raise TypeError("arange: start, stop and step must be scalars")
    if stop is None:
        start, stop = 0, start
    return _wrap(numpy.arange(start, stop, step, dtype=dtype))


def linspace(start, stop, num=50, endpoint=True, retstep=False, dtype=None, axis=0):
    result = numpy.linspace(start, stop, num, endpoint, retstep, dtype, axis)
    if retstep:
        return _wrap(result[0]), result[1]
    return _wrap(result)


def _host_data(obj, what):
    """What ``cupy.array``/``asarray`` copy to the device: host data (numpy arrays, scalars,
    sequences, which may hold device arrays, each read back to the host)."""
    if isinstance(obj, (list, tuple)) and builtins.any(isinstance(v, ndarray) for v in obj):
        return [v.get() if isinstance(v, ndarray) else v for v in obj]
    return obj


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, *, blocking=False):
    if isinstance(obj, ndarray):
        _operand(obj)
        result = obj._a.astype(obj.dtype if dtype is None else dtype, order=order,
                               copy=bool(copy) or True)
        if ndmin > result.ndim:
            result = result.reshape((1,) * (ndmin - result.ndim) + result.shape)
        return _wrap(result)
    host = numpy.array(_host_data(obj, "array"), dtype=dtype, copy=True, order=order,
                       ndmin=ndmin)
    return _from_host(host, copy=False)


if _double.RULES >= 14:
    def asarray(a, dtype=None, order=None, *, copy=None, blocking=False):
        """cupy/_creation/from_data.py asarray (14: ``copy=``)."""
        return _asarray(a, dtype, order, copy)
else:
    def asarray(a, dtype=None, order=None, *, blocking=False):
        """cupy/_creation/from_data.py asarray (13.6.0: no ``copy``)."""
        return _asarray(a, dtype, order, None)


def _asarray(a, dtype, order, copy):
    if isinstance(a, ndarray):
        _operand(a)
        same = (dtype is None or numpy.dtype(dtype) == a.dtype) and order in (None, "K", "A")
        if same and not copy:
            return a
        if copy is False and not same:
            raise ValueError("Unable to avoid copy while creating an array as requested.")
        return _wrap(a._a.astype(a.dtype if dtype is None else dtype,
                                 order="K" if order is None else order, copy=True))
    host = numpy.asarray(_host_data(a, "asarray"), dtype=dtype,
                         order="K" if order is None else order)
    return _from_host(host)


def ascontiguousarray(a, dtype=None):
    a = _array_arg(a)
    return _wrap(numpy.ascontiguousarray(a._a, dtype=dtype), a)


def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):
    """cupy/_creation/from_data.py asnumpy: a device-to-host copy (counted) for a device array;
    host data passes through ``numpy.asarray``."""
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out, blocking=blocking)
    result = numpy.asarray(a, order=order)
    if out is not None:
        out[...] = result
        return out
    return result


def copy(a, order="K"):
    a = _array_arg(a)
    return _wrap(a._a.copy(order=order))


def copyto(dst, src, casting="same_kind", where=None):
    if not isinstance(dst, ndarray):
        raise TypeError("dst must be cupy.ndarray")
    source = _operand(src) if not isinstance(src, (list, tuple)) else numpy.asarray(src)
    kwargs = {} if where is None else {"where": _operand(where)}
    numpy.copyto(dst._a, source, casting=casting, **kwargs)
    _double.launch()


def eye(N, M=None, k=0, dtype=float, order="C"):
    return _wrap(numpy.eye(N, M, k, dtype=dtype, order=order))


def identity(n, dtype=float):
    return eye(n, dtype=dtype)


def triu(m, k=0):
    m = _array_arg(m, "m")
    return _wrap(numpy.triu(m._a, k))


def tril(m, k=0):
    m = _array_arg(m, "m")
    return _wrap(numpy.tril(m._a, k))


# ---- manipulation (cupy/_manipulation/) ------------------------------------------------------

if _double.RULES >= 14:
    def reshape(a, newshape, order="C", *, copy=None):
        return _reshape(_array_arg(a), (newshape,), order, copy)
else:
    def reshape(a, newshape, order="C"):
        return _reshape(_array_arg(a), (newshape,), order, None)


def transpose(a, axes=None):
    a = _array_arg(a)
    return _wrap(numpy.transpose(a._a, axes), a)


def swapaxes(a, axis1, axis2):
    a = _array_arg(a)
    return _wrap(numpy.swapaxes(a._a, axis1, axis2), a)


def moveaxis(a, source, destination):
    a = _array_arg(a)
    return _wrap(numpy.moveaxis(a._a, source, destination), a)


def expand_dims(a, axis):
    a = _array_arg(a)
    return _wrap(numpy.expand_dims(a._a, axis), a)


def squeeze(a, axis=None):
    a = _array_arg(a)
    return _wrap(numpy.squeeze(a._a, axis), a)


def ravel(a, order="C"):
    a = _array_arg(a)
    return _wrap(numpy.ravel(a._a, order), a)


def broadcast_to(array, shape):
    array = _array_arg(array, "array")
    return _wrap(numpy.broadcast_to(array._a, shape), array)


def _arrays(tup, name="tup"):
    if isinstance(tup, ndarray):
        return [tup[i] for i in range(tup.shape[0])]
    return [_array_arg(a, name) for a in tup]


def concatenate(tup, axis=0, out=None, *, dtype=None, casting="same_kind"):
    arrays = _arrays(tup)
    out = _out_arg(out)
    if out is not None:
        numpy.concatenate([a._a for a in arrays], axis, out=out._a, dtype=dtype, casting=casting)
        _double.launch()
        return out
    return _wrap(numpy.concatenate([a._a for a in arrays], axis, dtype=dtype, casting=casting))


def stack(tup, axis=0, out=None, *, dtype=None, casting="same_kind"):
    arrays = _arrays(tup)
    out = _out_arg(out)
    if out is not None:
        numpy.stack([a._a for a in arrays], axis, out=out._a, dtype=dtype, casting=casting)
        _double.launch()
        return out
    return _wrap(numpy.stack([a._a for a in arrays], axis, dtype=dtype, casting=casting))


def repeat(a, repeats, axis=None):
    a = _array_arg(a)
    if isinstance(repeats, ndarray):
        # cupy/_manipulation/tiling.py -> _core repeat: a device array of repeats is read back
        repeats = repeats.tolist()
    elif isinstance(repeats, numpy.ndarray):
        repeats = repeats.tolist()
    return _wrap(numpy.repeat(a._a, repeats, axis))


def tile(A, reps):
    A = _array_arg(A, "A")
    return _wrap(numpy.tile(A._a, reps))


def flip(a, axis=None):
    a = _array_arg(a)
    return _wrap(numpy.flip(a._a, axis), a)


def roll(a, shift, axis=None):
    a = _array_arg(a)
    return _wrap(numpy.roll(a._a, shift, axis))


def diff(a, n=1, axis=-1, prepend=None, append=None):
    a = _array_arg(a)
    extra = {}
    if prepend is not None:
        extra["prepend"] = _operand(prepend)
    if append is not None:
        extra["append"] = _operand(append)
    return _wrap(numpy.diff(a._a, n, axis, **extra))


def pad(array, pad_width, mode="constant", **kwargs):
    array = _array_arg(array, "array")
    return _wrap(numpy.pad(array._a, pad_width, mode, **kwargs))


# ---- indexing (cupy/_indexing/) -------------------------------------------------------------

def take(a, indices, axis=None, out=None):
    a = _array_arg(a)
    indices = indices._a if isinstance(indices, ndarray) else indices
    return _finish(numpy.take(a._a, indices, axis), _out_arg(out))


def take_along_axis(a, indices, axis):
    a = _array_arg(a)
    indices = _array_arg(indices, "indices")
    return _wrap(numpy.take_along_axis(a._a, indices._a, axis))


def where(condition, x=None, y=None):
    """cupy/_sorting/search.py where: three arguments elementwise; one argument is nonzero()."""
    if x is None and y is None:
        return nonzero(condition)
    if x is None or y is None:
        raise ValueError("Must provide both 'x' and 'y' or neither.")
    return _wrap(numpy.where(_operand(condition), _operand(x), _operand(y)))


def nonzero(a):
    """A data-dependent shape: the count is read back to the host (counted)."""
    a = _array_arg(a)
    _double.device_to_host("nonzero()")
    return tuple(_wrap(i) for i in numpy.nonzero(a._a))


def flatnonzero(a):
    a = _array_arg(a)
    _double.device_to_host("flatnonzero()")
    return _wrap(numpy.flatnonzero(a._a))


def argwhere(a):
    a = _array_arg(a)
    _double.device_to_host("argwhere()")
    return _wrap(numpy.argwhere(a._a))


def unique(ar, return_index=False, return_inverse=False, return_counts=False, axis=None, *,
           equal_nan=True):
    ar = _array_arg(ar, "ar")
    _double.device_to_host("unique()")
    result = numpy.unique(ar._a, return_index, return_inverse, return_counts, axis,
                          equal_nan=equal_nan)
    return tuple(_wrap(r) for r in result) if isinstance(result, tuple) else _wrap(result)


def count_nonzero(a, axis=None):
    a = _array_arg(a)
    return _wrap(numpy.asarray(numpy.count_nonzero(a._a, axis)))


def bincount(x, weights=None, minlength=None):
    x = _array_arg(x, "x")
    _double.device_to_host("bincount() (its length)")
    w = None if weights is None else _array_arg(weights, "weights")._a
    return _wrap(numpy.bincount(x._a, w, 0 if minlength is None else minlength))


# ---- sorting and searching (cupy/_sorting/) --------------------------------------------------

def sort(a, axis=-1, kind=None):
    _check_kind_sort(kind)
    a = _array_arg(a)
    return _wrap(numpy.sort(a._a, axis=axis, kind="stable"))


def argsort(a, axis=-1, kind=None):
    _check_kind_sort(kind)
    a = _array_arg(a)
    return _wrap(numpy.argsort(a._a, axis=axis, kind="stable"))


def argpartition(a, kth, axis=-1):
    a = _array_arg(a)
    return _wrap(numpy.argpartition(a._a, kth, axis=axis))


def partition(a, kth, axis=-1):
    a = _array_arg(a)
    return _wrap(numpy.partition(a._a, kth, axis=axis))


def searchsorted(a, v, side="left", sorter=None):
    a = _array_arg(a)
    v = _operand(v)
    sorter = None if sorter is None else _array_arg(sorter, "sorter")._a
    return _wrap(numpy.asarray(numpy.searchsorted(a._a, v, side, sorter)))


def argmax(a, axis=None, dtype=None, out=None, keepdims=False):
    return _array_arg(a).argmax(axis, out, dtype, keepdims)


def argmin(a, axis=None, dtype=None, out=None, keepdims=False):
    return _array_arg(a).argmin(axis, out, dtype, keepdims)


# ---- reductions (cupy/_math/sumprod.py, cupy/_statistics/) ----------------------------------

def _reduce(numpy_function, a, axis, dtype, out, keepdims, **extra):
    a = _array_arg(a)
    out = _out_arg(out)
    if dtype is not None:
        extra["dtype"] = dtype
    return _finish(numpy_function(a._a, axis=axis, keepdims=keepdims, **extra), out)


def sum(a, axis=None, dtype=None, out=None, keepdims=False):
    return _reduce(numpy.sum, a, axis, dtype, out, keepdims)


def prod(a, axis=None, dtype=None, out=None, keepdims=False):
    return _reduce(numpy.prod, a, axis, dtype, out, keepdims)


def mean(a, axis=None, dtype=None, out=None, keepdims=False):
    return _reduce(numpy.mean, a, axis, dtype, out, keepdims)


def var(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    return _reduce(numpy.var, a, axis, dtype, out, keepdims, ddof=ddof)


def std(a, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    return _reduce(numpy.std, a, axis, dtype, out, keepdims, ddof=ddof)


def amax(a, axis=None, out=None, keepdims=False):
    return _reduce(numpy.amax, a, axis, None, out, keepdims)


def amin(a, axis=None, out=None, keepdims=False):
    return _reduce(numpy.amin, a, axis, None, out, keepdims)


max = amax
min = amin


def all(a, axis=None, out=None, keepdims=False):
    return _array_arg(a).all(axis, out, keepdims)


def any(a, axis=None, out=None, keepdims=False):
    return _array_arg(a).any(axis, out, keepdims)


def _scan(numpy_function, a, axis, dtype, out):
    """cupy/_core/_routines_math.pyx scan_core: ``out`` (a cupy.ndarray) takes the result in
    its own dtype; ``dtype`` then plays no part."""
    a = _array_arg(a)
    if out is not None:
        if not isinstance(out, ndarray):
            raise TypeError(f"Argument 'out' has incorrect type (expected cupy._core.core."
                            f"_ndarray_base, got {type(out).__name__})")
        result = numpy_function(a._a.astype(out.dtype), axis=axis)
        out._a[...] = result.reshape(out.shape)
        _double.launch()
        return out
    if dtype is None and a.dtype.kind in "biu":
        dtype = numpy.uint64 if a.dtype.kind == "u" else numpy.int64
    return _wrap(numpy_function(a._a, axis=axis, dtype=dtype))


def cumsum(a, axis=None, dtype=None, out=None):
    return _scan(numpy.cumsum, a, axis, dtype, out)


def cumprod(a, axis=None, dtype=None, out=None):
    return _scan(numpy.cumprod, a, axis, dtype, out)


def clip(a, a_min, a_max, out=None):
    a = _array_arg(a)
    low = None if a_min is None else _operand(a_min)
    high = None if a_max is None else _operand(a_max)
    return _finish(numpy.clip(a._a, low, high), _out_arg(out))


def around(a, decimals=0, out=None):
    return _array_arg(a).round(decimals, out)


round = around


def isclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    return _wrap(numpy.isclose(_operand(a), _operand(b), rtol, atol, equal_nan))


def allclose(a, b, rtol=1e-05, atol=1e-08, equal_nan=False):
    """cupy/_logic/comparison.py allclose: a 0-d device array (no copy to the host)."""
    return _wrap(numpy.asarray(numpy.allclose(_operand(a), _operand(b), rtol, atol, equal_nan)))


def array_equal(a1, a2, equal_nan=False):
    return _wrap(numpy.asarray(numpy.array_equal(_operand(a1), _operand(a2), equal_nan)))


def nan_to_num(x, copy=True, nan=0.0, posinf=None, neginf=None):
    """cupy/_math/misc.py nan_to_num: ``copy=False`` writes into x (one kernel either way)."""
    x = _array_arg(x, "x")
    result = numpy.nan_to_num(x._a, copy=copy, nan=nan, posinf=posinf, neginf=neginf)
    if not copy:
        _double.launch()
        return x
    return _wrap(result)


# ---- linear algebra (cupy/linalg/_product.py, cupy/_core/_routines_linalg.pyx) ---------------

def vdot(a, b):
    a, b = _array_arg(a), _array_arg(b, "b")
    return _wrap(numpy.asarray(numpy.vdot(a._a, b._a)))


def tensordot(a, b, axes=2):
    """cupy/linalg/_product.py tensordot: through ``tensordot_core`` (the compute type
    applies, as in ``dot``)."""
    a, b = _array_arg(a), _array_arg(b, "b")
    return _wrap(numpy.tensordot(*core_operands(a, b), axes))


def outer(a, b, out=None):
    a, b = _array_arg(a), _array_arg(b, "b")
    return _finish(numpy.outer(a._a, b._a), _out_arg(out))


def einsum(*operands, **kwargs):
    """einsum(subscripts, *operands, dtype=None, optimize=False)

    cupy/linalg/_einsum.py: only ``dtype`` and ``optimize``; any other keyword -- even
    ``out=None`` -- raises ``TypeError('Did not understand the following kwargs: %s')``.
    """
    dtype = kwargs.pop("dtype", None)
    optimize = kwargs.pop("optimize", False)
    if optimize is True:
        optimize = "greedy"
    if kwargs:
        raise TypeError("Did not understand the following kwargs: %s" % list(kwargs.keys()))
    converted = [operands[0]] + [_operand(op) for op in operands[1:]]
    result = numpy.einsum(*converted, dtype=dtype, optimize=optimize)
    return _wrap(numpy.asarray(result))


def trace(a, offset=0, axis1=0, axis2=1, dtype=None, out=None):
    a = _array_arg(a)
    return _finish(numpy.asarray(numpy.trace(a._a, offset, axis1, axis2, dtype)), _out_arg(out))


def diag(v, k=0):
    v = _array_arg(v, "v")
    return _wrap(numpy.diag(v._a, k))


# ---- types and modules ---------------------------------------------------------------------

def result_type(*arrays_and_dtypes):
    return numpy.result_type(*[a.dtype if isinstance(a, ndarray) else a
                               for a in arrays_and_dtypes])


def can_cast(from_, to, casting="safe"):
    return numpy.can_cast(from_.dtype if isinstance(from_, ndarray) else from_, to, casting)


def get_array_module(*args):
    import cupy
    return cupy if builtins.any(isinstance(a, ndarray) for a in args) else numpy


def is_available():
    from cupy.cuda import _state
    return _state.DEVICE_COUNT > 0


def get_default_memory_pool():
    from cupy.cuda import memory
    return memory.get_default_memory_pool()


__all__ = [_n for _n, _v in list(globals().items())
           if not _n.startswith("_") and callable(_v) and getattr(_v, "__module__", None) == __name__]
__all__ += ["max", "min", "round", "dot", "matmul"]
