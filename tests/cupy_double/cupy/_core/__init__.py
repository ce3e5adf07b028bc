"""The double's ndarray: a NumPy array on an emulated device, as strict as ``cupy.ndarray``.

Each rule cites the CuPy source it mirrors (v14.2.0 unless a 13.6.0 difference is named); the
table in RULES.md lists them all. The array is a wrapper, not a ``numpy.ndarray`` subclass: NumPy
cannot take it implicitly (``__array__`` raises as CuPy's does), and NumPy functions applied to
it dispatch to the double's routines through ``__array_function__``/``__array_ufunc__``, as they
do to CuPy's.
"""

from __future__ import annotations

import ctypes
import functools
import numbers
import weakref

import numpy

try:
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:    # NumPy < 2
    _byte_bounds = numpy.byte_bounds

from cupy import _double
from cupy.cuda import _state

_SCALAR_TYPES = (bool, int, float, complex)


# ---- device memory -------------------------------------------------------------------------

class _Allocation:
    """One device allocation: the NumPy array holding its bytes, its device, its fake address.

    Addresses are handed out from a counter and never reused (cupy/cuda/memory.pyx allocates
    in multiples of 512 bytes); the bytes are accounted on the device until the last array using
    them is gone (``cupy.cuda.runtime.memGetInfo``)."""

    __slots__ = ("host", "low", "high", "ptr", "device_id", "nbytes", "__weakref__")

    def __init__(self, host: numpy.ndarray) -> None:
        self.host = host
        self.low, self.high = _byte_bounds(host) if host.size else (0, 0)
        self.nbytes = self.high - self.low
        self.device_id = _state.current_device()
        self.ptr = _state.allocate(self.nbytes, self.device_id)
        _state.register(self)
        weakref.finalize(self, _state.release, self.ptr, self.nbytes, self.device_id)

    def contains(self, array: numpy.ndarray) -> bool:
        if not array.size or not self.nbytes:
            return False
        low, high = _byte_bounds(array)
        return self.low <= low and high <= self.high

    def view(self, offset: int, count: int, dtype) -> numpy.ndarray:
        """``count`` elements of ``dtype`` at byte ``offset``: what a device pointer names."""
        dtype = numpy.dtype(dtype)
        if offset < 0 or offset + count * dtype.itemsize > self.nbytes:
            raise ValueError("pointer range outside its allocation")
        raw = (ctypes.c_char * self.nbytes).from_address(self.low)
        return numpy.frombuffer(raw, dtype=numpy.uint8)[offset:offset + count * dtype.itemsize].view(dtype)


class MemoryPointer:
    """What ``ndarray.data`` is: ``ptr`` (an int, the device address of the first element,
    unique per allocation and offset), ``device_id``, ``mem`` (cupy/cuda/memory.pyx)."""

    __slots__ = ("mem", "ptr", "device_id")

    def __init__(self, mem: _Allocation, offset: int) -> None:
        self.mem, self.ptr, self.device_id = mem, mem.ptr + offset, mem.device_id

    @property
    def device(self):
        from cupy.cuda import Device
        return Device(self.device_id)

    def __int__(self) -> int:
        return self.ptr

    def __eq__(self, other) -> bool:
        return isinstance(other, MemoryPointer) and other.ptr == self.ptr

    def __hash__(self) -> int:
        return hash(self.ptr)

    def __repr__(self) -> str:
        return f"<MemoryPointer 0x{self.ptr:x} device={self.device_id}>"


class Flags:
    """``ndarray.flags`` (cupy/_core/flags.pyx): c_contiguous, f_contiguous, owndata, and the
    same by key."""

    def __init__(self, c_contiguous: bool, f_contiguous: bool, owndata: bool) -> None:
        self.c_contiguous, self.f_contiguous, self.owndata = c_contiguous, f_contiguous, owndata

    def __getitem__(self, name: str) -> bool:
        keys = {"C_CONTIGUOUS": "c_contiguous", "F_CONTIGUOUS": "f_contiguous", "OWNDATA": "owndata"}
        if name not in keys:
            raise KeyError(f"{name} is not defined for cupy.ndarray.flags")
        return getattr(self, keys[name])

    def __repr__(self) -> str:
        return "\n".join(f"  {k.upper()} : {getattr(self, k)}"
                         for k in ("c_contiguous", "f_contiguous", "owndata"))


# ---- wrapping and checking operands ---------------------------------------------------------

def _wrap(result, *parents):
    """A NumPy result as a double array: a view of a parent's allocation when its memory lies
    inside one (indexing, reshape, transpose...), else a new allocation, which device work
    filled: one launch. NumPy scalars become 0-d arrays, as CuPy's reductions return 0-d
    arrays (cupy/_core/_reduction.pyx)."""
    if isinstance(result, numpy.generic):
        result = numpy.asarray(result)
    if not isinstance(result, numpy.ndarray):
        raise TypeError(f"internal: cannot wrap {type(result)}")
    for parent in parents:
        if isinstance(parent, ndarray) and parent._mem.contains(result):
            return ndarray._make(result, parent._mem)
    _double.launch()
    return ndarray._make(result, None)


def _unsupported(value):
    # cupy/_core/_scalar.pyx CScalar.__init__ (v14.2.0), cupy/_core/_kernel.pyx
    # _preprocess_arg (v13.6.0): 'Unsupported type %s' % type(arg)
    return TypeError(f"Unsupported type {type(value)}")


def _check_device(array: ndarray) -> None:
    """cupy/_core/_kernel.pyx _check_peer_access: an array of another device than the current
    one is refused (as where peer access is unavailable)."""
    device_id = _state.current_device()
    if array._mem.device_id != device_id:
        raise ValueError(
            f"The device where the array resides ({array._mem.device_id}) is different from the "
            f"current device ({device_id}). Peer access is unavailable between these devices.")


def _operand(value):
    """A ufunc operand as NumPy sees it: double arrays (checked for their device), Python and
    NumPy scalars; anything else -- a numpy.ndarray above all -- is refused as CuPy refuses it."""
    if isinstance(value, ndarray):
        _check_device(value)
        return value._a
    if type(value) in _SCALAR_TYPES or isinstance(value, numpy.generic):
        return value
    raise _unsupported(value)


def _array_arg(value, name: str = "a"):
    """A routine's array argument: a double array (cupy.ndarray); Python scalars and sequences
    are converted (as CuPy's routines do through cupy.asarray, a host-to-device copy); a
    numpy.ndarray is refused where CuPy's routine types the argument as cupy.ndarray."""
    if isinstance(value, ndarray):
        _check_device(value)
        return value
    if isinstance(value, numpy.ndarray):
        raise TypeError(f"Argument '{name}' has incorrect type (expected cupy.ndarray, got "
                        f"numpy.ndarray)")
    if type(value) in _SCALAR_TYPES or isinstance(value, (numpy.generic, list, tuple)):
        return _from_host(numpy.asarray(value))
    raise _unsupported(value)


def _out_arg(out):
    if out is None:
        return None
    if not isinstance(out, ndarray):
        # cupy/_core/_kernel.pyx _get_out_args: outputs must be cupy.ndarray
        raise TypeError(f"Output arguments must be cupy.ndarray, not {type(out)}")
    _check_device(out)
    return out


def _from_host(host: numpy.ndarray, dtype=None, copy: bool = True):
    """A host-to-device copy (never counted: only device-to-host copies are)."""
    data = numpy.array(host, dtype=dtype, copy=True, order="C") if copy else host
    return ndarray._make(data, None)


def _get(array: ndarray, what: str) -> numpy.ndarray:
    """A device-to-host copy of ``array``: counted."""
    _double.device_to_host(what)
    return array._a.copy()


# ---- ufuncs ----------------------------------------------------------------------------------

class ufunc:
    """An elementwise function as CuPy's (cupy/_core/_kernel.pyx ``ufunc.__call__``): inputs are
    double arrays or scalars, keywords only ``out``, ``dtype``, ``casting`` (and the private
    ``_where``); anything else raises ``TypeError('Wrong arguments %s' % kwargs)``."""

    def __init__(self, name: str, numpy_ufunc, doc: str = "") -> None:
        self.name = f"cupy_{name}"
        self.__name__ = name
        self._numpy = numpy_ufunc
        self.nin, self.nout, self.nargs = numpy_ufunc.nin, numpy_ufunc.nout, numpy_ufunc.nargs
        self.__doc__ = doc or f"{name}: the elementwise function of the double (NumPy's {name})."

    def __repr__(self) -> str:
        return f"<ufunc '{self.name}'>"

    def __call__(self, *args, **kwargs):
        out = kwargs.pop("out", None)
        where = kwargs.pop("_where", None)
        dtype = kwargs.pop("dtype", None)
        casting = kwargs.pop("casting", "same_kind")
        if kwargs:
            raise TypeError("Wrong arguments %s" % kwargs)
        n_args = len(args)
        if not (self.nin <= n_args <= self.nargs):
            raise TypeError(
                "Wrong number of arguments for {!r}. It must be either {} or {} (with outputs), "
                "but given {}.".format(self.name, self.nin, self.nargs, n_args))
        in_args, out_args = args[:self.nin], args[self.nin:]
        if out is not None:
            if out_args:
                raise ValueError("Cannot specify 'out' as both a positional and keyword argument")
            out_args = out if isinstance(out, tuple) else (out,)
        inputs = [_operand(a) for a in in_args]
        outs = [_out_arg(o) for o in out_args]
        extra = {}
        if where is not None:
            extra["where"] = _operand(where)
        if dtype is not None:
            extra["dtype"] = dtype
        parents = [a for a in in_args if isinstance(a, ndarray)]
        if outs:
            self._numpy(*inputs, out=tuple(o._a for o in outs), casting=casting, **extra)
            _double.launch()
            return outs[0] if len(outs) == 1 else tuple(outs)
        result = self._numpy(*inputs, casting=casting, **extra)
        if isinstance(result, tuple):
            return tuple(_wrap(r) for r in result)
        return _wrap(result)

    def outer(self, A, B, **kwargs):
        """cupy/_core/_kernel.pyx ``ufunc.outer``: ``self(A[..., None...], B, **kwargs)``."""
        A, B = _array_arg(A, "A"), _array_arg(B, "B")
        return self(A.reshape(A.shape + (1,) * B.ndim), B, **kwargs)

    def reduce(self, array, axis=0, dtype=None, out=None, keepdims=False):
        array = _array_arg(array, "array")
        out = _out_arg(out)
        result = self._numpy.reduce(array._a, axis=axis, dtype=dtype, keepdims=keepdims)
        return _finish(result, out, array)


def _finish(result, out, *parents):
    """Put a NumPy result in ``out`` (a double array: one launch) or wrap it."""
    if out is not None:
        numpy.copyto(out._a, result, casting="same_kind")
        _double.launch()
        return out
    return _wrap(result, *parents)


# ---- the array -----------------------------------------------------------------------------



def _index_arg(key):
    """An index as NumPy takes it, and whether it is a boolean mask (a data-dependent shape:
    CuPy computes the nonzero count on the host, a device-to-host copy)."""
    parts = key if isinstance(key, tuple) else (key,)
    mask = False
    converted = []
    for part in parts:
        if isinstance(part, ndarray):
            _check_device(part)
            if part.dtype == numpy.bool_ and part.ndim > 0:
                mask = True
            converted.append(part._a)
        elif isinstance(part, numpy.ndarray):
            mask = mask or (part.dtype == numpy.bool_ and part.ndim > 0)
            converted.append(part)
        elif isinstance(part, list):
            as_array = numpy.asarray(part)
            mask = mask or as_array.dtype == numpy.bool_
            converted.append(as_array)
        else:
            converted.append(part)
    return (tuple(converted) if isinstance(key, tuple) else converted[0]), mask


class ndarray:
    """``cupy.ndarray`` of the double (cupy/_core/core.pyx): a NumPy array on an emulated
    device. ``ndarray(shape, dtype=float)`` allocates without initialising: NaN-filled (integer
    arrays: a garbage value), so reads of uninitialised memory show."""

    __array_priority__ = 100          # cupy/_core/core.pyx
    __hash__ = None                   # unhashable, as cupy.ndarray is
    __slots__ = ("_a", "_mem", "__weakref__")

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        if memptr is not None or strides is not None:
            raise NotImplementedError("the double does not map external memory")
        host = _garbage(shape, dtype, order)
        self._a = host
        self._mem = _Allocation(host)

    @classmethod
    def _make(cls, host: numpy.ndarray, mem: _Allocation | None):
        self = object.__new__(cls)
        self._a = host
        self._mem = mem if mem is not None else _Allocation(host)
        return self

    # -- refusals (cupy/_core/core.pyx) --
    def __array__(self, dtype=None, copy=None):
        # CuPy 14.2's takes no ``copy``: NumPy 2 calls with it first and, refused, warns that
        # __array__ must take it before calling again. The double takes the keyword, so that
        # the one refusal seen is CuPy's own, without NumPy's migration warning.
        raise TypeError(
            "Implicit conversion to a NumPy array is not allowed. "
            "Please use `.get()` to construct a NumPy array explicitly.")

    # -- NumPy's protocols (cupy/_core/core.pyx __array_ufunc__, __array_function__) --
    def __array_ufunc__(self, ufunc_, method, *inputs, **kwargs):
        import cupy
        inout = inputs
        if "out" in kwargs:
            out = kwargs["out"]
            if len(out) != 1:
                raise ValueError("The 'out' parameter must have exactly one array value")
            inout += out
            kwargs["out"] = out[0]
        if method not in ("__call__", "outer", "at", "reduce", "accumulate", "reduceat"):
            return NotImplemented
        func = getattr(cupy, ufunc_.__name__, None)
        if func is None or (method != "__call__" and not hasattr(func, method)):
            return NotImplemented
        if method != "__call__":
            func = getattr(func, method)
        for x in inout:
            if (type(x) not in _SCALAR_TYPES and not isinstance(x, numpy.generic)
                    and not isinstance(x, (ndarray, numpy.ndarray))):
                return NotImplemented
        if ufunc_.__name__ in ("greater", "greater_equal", "less", "less_equal", "equal",
                               "not_equal"):
            inputs = tuple(x.item() if isinstance(x, numpy.ndarray) and x.ndim == 0 else x
                           for x in inputs)
        return func(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        import cupy
        try:
            module = functools.reduce(getattr, func.__module__.split(".")[1:], cupy)
            cupy_func = getattr(module, func.__name__)
        except AttributeError:
            return NotImplemented
        if cupy_func is func:
            return NotImplemented
        for t in types:
            if not issubclass(t, (ndarray, numpy.ndarray)):
                return NotImplemented
        return cupy_func(*args, **kwargs)

    # -- attributes --
    @property
    def shape(self):
        return self._a.shape

    @shape.setter
    def shape(self, value):
        self._a.shape = value

    @property
    def dtype(self):
        return self._a.dtype

    @property
    def ndim(self):
        return self._a.ndim

    @property
    def size(self):
        return self._a.size

    @property
    def itemsize(self):
        return self._a.itemsize

    @property
    def nbytes(self):
        return self._a.nbytes

    @property
    def strides(self):
        return self._a.strides

    @property
    def flags(self):
        return Flags(self._a.flags.c_contiguous, self._a.flags.f_contiguous,
                     self._mem.host is self._a)

    @property
    def base(self):
        return None if self._mem.host is self._a else _wrap(self._mem.host, self)

    @property
    def data(self):
        offset = (_byte_bounds(self._a)[0] - self._mem.low) if self._a.size else 0
        return MemoryPointer(self._mem, offset)

    @property
    def device(self):
        from cupy.cuda import Device
        return Device(self._mem.device_id)

    @property
    def T(self):
        return _wrap(self._a.T, self)

    if _double.RULES >= 14:     # ndarray.mT: new in CuPy 14
        @property
        def mT(self):
            return _wrap(self._a.mT, self)

    @property
    def real(self):
        return _wrap(self._a.real, self)

    @property
    def imag(self):
        return _wrap(self._a.imag, self)

    @property
    def __cuda_array_interface__(self):
        # cupy/_core/core.pyx __cuda_array_interface__ (version 3)
        desc = {"shape": self.shape, "typestr": self.dtype.str, "descr": self.dtype.descr,
                "version": 3, "data": (self.data.ptr, False),
                "strides": None if self._a.flags.c_contiguous else self.strides}
        from cupy.cuda import get_current_stream
        stream_ptr = get_current_stream().ptr
        desc["stream"] = stream_ptr if stream_ptr != 0 else 1
        return desc

    # -- device to host: every one counted (cupy/_core/core.pyx: each calls self.get()) --
    def get(self, stream=None, order="C", out=None, blocking=True):
        if out is not None:
            if not isinstance(out, numpy.ndarray):
                raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
            if out.shape != self.shape:
                raise ValueError("Shape mismatch. Expected shape: {}, actual shape: {}".format(
                    self.shape, out.shape))
            _double.device_to_host("get(out=)")
            numpy.copyto(out, self._a)
            return out
        host = _get(self, "get()")
        return numpy.asarray(host, order=order) if order != "A" else host

    def item(self):
        return _get(self, "item()").item()

    def tolist(self):
        return _get(self, "tolist()").tolist()

    def __float__(self):
        return float(_get(self, "float()"))

    def __int__(self):
        return int(_get(self, "int()"))

    def __complex__(self):
        return complex(_get(self, "complex()"))

    def __bool__(self):
        if self.size == 0:
            return False
        if self.size == 1:
            return bool(_get(self, "bool()"))
        raise ValueError("The truth value of an array with more than one element is "
                         "ambiguous. Use a.any() or a.all()")

    def __repr__(self):
        return repr(_get(self, "repr()"))

    def __str__(self):
        return str(_get(self, "str()"))

    def __format__(self, format_spec):
        return format(_get(self, "format()"), format_spec)

    def __iter__(self):
        # cupy/_core/core.pyx: each element a device array (no copy by itself)
        if self.ndim == 0:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __reduce__(self):
        import cupy
        return cupy.array, (self.get(),)

    def set(self, arr, stream=None):
        if not isinstance(arr, numpy.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.shape != arr.shape:
            raise ValueError("Shape mismatch. Old shape: {}, new shape: {}".format(
                self.shape, arr.shape))
        numpy.copyto(self._a, arr, casting="unsafe")

    # -- indexing --
    def __getitem__(self, key):
        index, mask = _index_arg(key)
        if mask:
            _double.device_to_host("boolean mask index")
        result = self._a[index]
        if isinstance(result, numpy.generic):      # one element: CuPy's is a 0-d view
            result = self._a[(index if isinstance(index, tuple) else (index,)) + (Ellipsis,)]
        return _wrap(result, self)

    def __setitem__(self, key, value):
        index, mask = _index_arg(key)
        if mask:
            _double.device_to_host("boolean mask index")
        if isinstance(value, ndarray):
            _check_device(value)
            value = value._a
        self._a[index] = value
        _double.launch()

    # -- operators (cupy/_core/core.pyx: the ufuncs; numpy.ndarray operands refused) --
    def _binary(self, other, name, reflected=False):
        import cupy
        # cupy/_core/core.pyx _should_use_rop: defer to an operand that opts out of ufuncs
        if not isinstance(other, ndarray) and getattr(other, "__array_ufunc__", 0) is None:
            return NotImplemented
        func = getattr(cupy, name)
        return func(other, self) if reflected else func(self, other)

    def __add__(self, other): return self._binary(other, "add")
    def __radd__(self, other): return self._binary(other, "add", True)
    def __sub__(self, other): return self._binary(other, "subtract")
    def __rsub__(self, other): return self._binary(other, "subtract", True)
    def __mul__(self, other): return self._binary(other, "multiply")
    def __rmul__(self, other): return self._binary(other, "multiply", True)
    def __truediv__(self, other): return self._binary(other, "true_divide")
    def __rtruediv__(self, other): return self._binary(other, "true_divide", True)
    def __floordiv__(self, other): return self._binary(other, "floor_divide")
    def __rfloordiv__(self, other): return self._binary(other, "floor_divide", True)
    def __mod__(self, other): return self._binary(other, "remainder")
    def __rmod__(self, other): return self._binary(other, "remainder", True)
    def __pow__(self, other, modulo=None): return self._binary(other, "power")
    def __rpow__(self, other): return self._binary(other, "power", True)
    def __and__(self, other): return self._binary(other, "bitwise_and")
    def __rand__(self, other): return self._binary(other, "bitwise_and", True)
    def __or__(self, other): return self._binary(other, "bitwise_or")
    def __ror__(self, other): return self._binary(other, "bitwise_or", True)
    def __xor__(self, other): return self._binary(other, "bitwise_xor")
    def __rxor__(self, other): return self._binary(other, "bitwise_xor", True)
    def __lshift__(self, other): return self._binary(other, "left_shift")
    def __rshift__(self, other): return self._binary(other, "right_shift")
    def __lt__(self, other): return self._binary(other, "less")
    def __le__(self, other): return self._binary(other, "less_equal")
    def __gt__(self, other): return self._binary(other, "greater")
    def __ge__(self, other): return self._binary(other, "greater_equal")
    def __eq__(self, other): return self._binary(other, "equal")
    def __ne__(self, other): return self._binary(other, "not_equal")

    def __matmul__(self, other):
        import cupy
        if not isinstance(other, ndarray) and getattr(other, "__array_ufunc__", 0) is None:
            return NotImplemented
        return cupy.matmul(self, other)

    def __rmatmul__(self, other):
        import cupy
        return cupy.matmul(other, self)

    def _inplace(self, other, name):
        import cupy
        return getattr(cupy, name)(self, other, self)

    def __iadd__(self, other): return self._inplace(other, "add")
    def __isub__(self, other): return self._inplace(other, "subtract")
    def __imul__(self, other): return self._inplace(other, "multiply")
    def __itruediv__(self, other): return self._inplace(other, "true_divide")
    def __ifloordiv__(self, other): return self._inplace(other, "floor_divide")
    def __imod__(self, other): return self._inplace(other, "remainder")
    def __ipow__(self, other): return self._inplace(other, "power")
    def __iand__(self, other): return self._inplace(other, "bitwise_and")
    def __ior__(self, other): return self._inplace(other, "bitwise_or")
    def __ixor__(self, other): return self._inplace(other, "bitwise_xor")

    def __neg__(self):
        import cupy
        return cupy.negative(self)

    def __pos__(self):
        import cupy
        return cupy.positive(self)

    def __abs__(self):
        import cupy
        return cupy.absolute(self)

    def __invert__(self):
        import cupy
        return cupy.invert(self)

    def __copy__(self):
        return self.copy()

    def __deepcopy__(self, memo):
        return self.copy()

    # -- methods, with CuPy's signatures (cupy/_core/core.pyx; conformance-tested) --
    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        if subok is not None:
            # cupy/_core/core.pyx _astype: subok is not supported
            raise TypeError("subok is not supported yet")
        dtype = numpy.dtype(dtype)
        if not copy and dtype == self.dtype and (order in ("K", "A") or
                                                 (order == "C" and self._a.flags.c_contiguous)
                                                 or (order == "F" and self._a.flags.f_contiguous)):
            return self
        result = self._a.astype(dtype, order=order, casting=casting or "unsafe", copy=True)
        return _wrap(result)

    # cupy/_core/core.pyx reshape: (*shape, order='C', copy=None) on 14; (*shape, order='C')
    # on 13.6.0, where reshape(..., copy=...) is a TypeError
    if _double.RULES >= 14:
        def reshape(self, *shape, order="C", copy=None):
            return _reshape(self, shape, order, copy)
    else:
        def reshape(self, *shape, order="C"):
            return _reshape(self, shape, order, None)

    def transpose(self, *axes):
        if len(axes) == 1 and (axes[0] is None or isinstance(axes[0], (tuple, list))):
            axes = axes[0]
        return _wrap(self._a.transpose(axes) if axes else self._a.transpose(), self)

    def swapaxes(self, axis1, axis2):
        return _wrap(self._a.swapaxes(axis1, axis2), self)

    def ravel(self, order="C"):
        return _wrap(self._a.ravel(order=order), self)

    def flatten(self, order="C"):
        return _wrap(self._a.flatten(order=order))

    def squeeze(self, axis=None):
        return _wrap(self._a.squeeze(axis=axis), self)

    def view(self, dtype=None, type=None):
        if type is not None:
            raise ValueError("the double's view() takes no type")
        return _wrap(self._a.view() if dtype is None else self._a.view(dtype), self)

    def copy(self, order="C"):
        return _wrap(self._a.copy(order=order))

    def fill(self, value):
        if isinstance(value, ndarray):
            _check_device(value)
            value = value._a
        elif isinstance(value, numpy.ndarray):
            raise _unsupported(value)
        self._a.fill(value)
        _double.launch()

    def sum(self, axis=None, dtype=None, out=None, keepdims=False):
        import cupy
        return cupy.sum(self, axis, dtype, out, keepdims)

    def mean(self, axis=None, dtype=None, out=None, keepdims=False):
        import cupy
        return cupy.mean(self, axis, dtype, out, keepdims)

    def var(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
        import cupy
        return cupy.var(self, axis, dtype, out, ddof, keepdims)

    def std(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
        import cupy
        return cupy.std(self, axis, dtype, out, ddof, keepdims)

    def prod(self, axis=None, dtype=None, out=None, keepdims=None):
        import cupy
        return cupy.prod(self, axis, dtype, out, bool(keepdims))

    def max(self, axis=None, out=None, keepdims=False):
        import cupy
        return cupy.amax(self, axis, out, keepdims)

    def min(self, axis=None, out=None, keepdims=False):
        import cupy
        return cupy.amin(self, axis, out, keepdims)

    def argmax(self, axis=None, out=None, dtype=None, keepdims=False):
        return _arg_reduce(self, numpy.argmax, axis, out, dtype, keepdims)

    def argmin(self, axis=None, out=None, dtype=None, keepdims=False):
        return _arg_reduce(self, numpy.argmin, axis, out, dtype, keepdims)

    def all(self, axis=None, out=None, keepdims=False):
        return _finish(self._a.all(axis=axis, keepdims=keepdims), _out_arg(out), self)

    def any(self, axis=None, out=None, keepdims=False):
        return _finish(self._a.any(axis=axis, keepdims=keepdims), _out_arg(out), self)

    def cumsum(self, axis=None, dtype=None, out=None):
        import cupy
        return cupy.cumsum(self, axis, dtype, out)

    def clip(self, min=None, max=None, out=None):
        import cupy
        return cupy.clip(self, min, max, out)

    def round(self, decimals=0, out=None):
        return _finish(self._a.round(decimals), _out_arg(out), self)

    def dot(self, b, out=None):
        import cupy
        if not isinstance(b, ndarray):
            raise TypeError(f"Argument 'b' has incorrect type (expected cupy._core.core."
                            f"_ndarray_base, got {type(b).__name__})")
        return cupy.dot(self, b, out)

    def take(self, indices, axis=None, out=None):
        import cupy
        return cupy.take(self, indices, axis, out)

    def repeat(self, repeats, axis=None):
        import cupy
        return cupy.repeat(self, repeats, axis)

    def nonzero(self):
        import cupy
        return cupy.nonzero(self)

    # cupy/_core/core.pyx sort(self, int axis=-1, kind=None) on 14 (kind None or 'stable');
    # sort(self, int axis=-1) on 13.6.0: no kind at all
    if _double.RULES >= 14:
        def sort(self, axis=-1, kind=None):
            _check_kind_sort(kind)
            self._a.sort(axis=axis, kind="stable")
            _double.launch()
    else:
        def sort(self, axis=-1):
            self._a.sort(axis=axis, kind="stable")
            _double.launch()

    # cupy/_core/core.pyx argsort(self, axis=-1, kind=None) on 14; argsort(self, axis=-1) on 13.6.0
    if _double.RULES >= 14:
        def argsort(self, axis=-1, kind=None):
            import cupy
            return cupy.argsort(self, axis, kind)
    else:
        def argsort(self, axis=-1):
            import cupy
            return cupy.argsort(self, axis)

    def argpartition(self, kth, axis=-1):
        import cupy
        return cupy.argpartition(self, kth, axis)

    def searchsorted(self, v, side="left", sorter=None):
        import cupy
        return cupy.searchsorted(self, v, side, sorter)

    def diagonal(self, offset=0, axis1=0, axis2=1):
        return _wrap(self._a.diagonal(offset, axis1, axis2), self)

    def conj(self):
        return _wrap(self._a.conj())

    def tobytes(self, order="C"):
        return _get(self, "tobytes()").tobytes(order)


def _check_kind_sort(kind):
    # cupy/_core/core.pyx _check_kind_sort (14), cupy/_sorting/sort.py (13 and 14)
    if kind is not None and kind != "stable":
        raise ValueError("kind can only be None or 'stable'")


def _reshape(array, shape, order, copy):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    if order not in ("C", "F", "A", "c", "f", "a"):
        raise ValueError("order not understood")
    if copy:
        return _wrap(array._a.reshape(shape, order=order).copy(order=order))
    if copy is False:
        view = array._a.view()
        try:
            view.shape = shape
        except AttributeError as exc:
            raise ValueError("Unable to avoid copy while reshaping.") from exc
        return _wrap(view, array)
    return _wrap(array._a.reshape(shape, order=order), array)


def _arg_reduce(array, numpy_function, axis, out, dtype, keepdims):
    result = numpy_function(array._a, axis=axis, keepdims=keepdims)
    if dtype is not None:
        result = numpy.asarray(result).astype(dtype)
    return _finish(result, _out_arg(out), array)


def _garbage(shape, dtype, order="C") -> numpy.ndarray:
    """Uninitialised memory, made visible: NaN for floating and complex types, a large garbage
    value for integers, True for booleans."""
    dtype = numpy.dtype(dtype)
    count = numpy.prod(shape if isinstance(shape, (tuple, list)) else (shape,), dtype=numpy.int64)
    _state.check_fits(int(count) * dtype.itemsize, _state.current_device())
    host = numpy.empty(shape, dtype=dtype, order=order if order in ("C", "F") else "C")
    if dtype.kind in "fc":
        host.fill(numpy.nan)
    elif dtype.kind in "iu":
        host.fill(numpy.iinfo(dtype).max - 6)
    elif dtype.kind == "b":
        host.fill(True)
    return host




ndarray.__module__ = "cupy"             # type(x) prints as cupy.ndarray, as CuPy's does
MemoryPointer.__module__ = "cupy.cuda.memory"

# cupy/_core/__init__.py: the compute type of products, from _routines_linalg (which imports the
# helpers above)
from cupy._core._routines_linalg import get_compute_type, set_compute_type  # noqa: E402,F401
