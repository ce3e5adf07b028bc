"""The counting stand-in of bench_ops.py: NumPy's module and arrays, every array operation and
every host sync counted (and, for bench_train.py's breakdown, timed), by module and phase.

- an *operation* is one call of an array-creating or array-transforming function of the module
  (``xp.exp``, ``xp.zeros``, ``xp.einsum``, ...), one ufunc call or reduction on an array
  (``a + b``, ``a @ b``, ``a *= s``, ``a.sum()``), one fancy-index read (``a[ids]``), one write
  through an index (``a[idx] = b``), one copy (``a.copy()``, ``a.astype(t)``, a ``reshape`` that
  cannot be a view), one random draw, one host-to-device copy. Views (slices, transposes,
  reshapes of contiguous arrays) are free, as on a GPU, and so are allocations that write
  nothing (``xp.empty``, ``xp.empty_like``: memory from the pool, no kernel). A function that
  runs several operations internally counts once: the count is what the library asks for, not
  how NumPy does it.
- a *sync* is one conversion of an array to a Python number or a host array (``float(a)``,
  ``int(a)``, ``bool(a)``, ``a.item()``, ``a.tolist()``, ``backend.to_host(a)``), and one
  operation whose result's shape depends on the data (``xp.flatnonzero``, ``xp.nonzero``,
  ``xp.unique``, ``a[boolean_mask]``): the host must wait to learn that shape.

Whole reductions return 0-d arrays, as on a GPU (NumPy would return a host scalar), so reading
one counts as a sync. Every operation is attributed to the innermost ``minitfm`` module on the
call stack (``layers.layernorm``, ``optim``, ``train``, ...) and to a phase: ``optimizer``
(anything under ``minitfm.optim``), ``backward`` (under a function named ``backward`` or
``*_backward``), ``forward`` (other model and layer code), ``loop`` (the training loop itself:
accumulation, checks, logging).
"""

from __future__ import annotations

import collections
import contextlib
import sys
import time
import types

import numpy

from minitfm import backend

# ---- the counting stand-in ---------------------------------------------------------------------


class Tally:
    """Operations and syncs, each by (phase, module); with ``clock`` set, seconds as well."""

    def __init__(self):
        self.ops = collections.Counter()
        self.syncs = collections.Counter()
        self.depth = 0            # > 0 inside a counted call: nested work is not counted again
        self.clock = None         # a Counter: seconds by (phase, module, operation name)

    def where(self) -> tuple[str, str]:
        frame = sys._getframe(2)
        module = phase = None
        while frame is not None:
            name = frame.f_globals.get("__name__", "")
            if name.startswith("minitfm.") and name != "minitfm.backend":
                short = name[len("minitfm."):]
                if module is None:
                    module = short
                func = frame.f_code.co_name
                if phase is None and short in ("optim", "gradscale"):     # Adam, clipping
                    phase = "optimizer"
                if phase is None and (func == "backward" or func.endswith("_backward")):
                    phase = "backward"
            frame = frame.f_back
        module = module or "other"
        if phase is None:
            phase = "loop" if module == "other" or module.startswith("training") else "forward"
        return phase, module

    def op(self, n: int = 1) -> None:
        if self.depth == 0:
            self.ops[self.where()] += n

    def sync(self) -> None:
        if self.depth == 0:
            self.syncs[self.where()] += 1

    @contextlib.contextmanager
    def inside(self, name: str):
        """The work of one operation ``name``: nested calls are not counted again, and with
        ``clock`` set the outermost one is timed."""
        key = None
        if self.clock is not None and self.depth == 0:
            key = (*self.where(), name)
            start = time.perf_counter()
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if key is not None:
                self.clock[key] += time.perf_counter() - start


TALLY = Tally()


def _plain(value):
    """Strip the counting subclass from arrays, also inside lists, tuples and dicts."""
    if isinstance(value, Counted):
        return value.view(numpy.ndarray)
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _counted(value):
    """Arrays (and NumPy scalars, which a GPU would return as 0-d arrays) as counted arrays."""
    if isinstance(value, numpy.ndarray) and not isinstance(value, Counted):
        return value.view(Counted)
    if isinstance(value, numpy.generic):
        return numpy.asarray(value).view(Counted)
    if isinstance(value, tuple):
        return tuple(_counted(v) for v in value)
    if isinstance(value, list):
        return [_counted(v) for v in value]
    return value


def _shares(result, base) -> bool:
    return (isinstance(result, numpy.ndarray)
            and numpy.shares_memory(_plain(result), base.view(numpy.ndarray)))


class Counted(numpy.ndarray):
    """An ndarray whose operations are counted in TALLY."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        TALLY.op()
        out = kwargs.get("out")
        name = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
        with TALLY.inside(name):
            result = getattr(ufunc, method)(*_plain(inputs), **_plain(kwargs))
        if out is not None:
            return out[0] if len(out) == 1 else out
        return None if method == "at" else _counted(result)

    def __array_function__(self, func, types_, args, kwargs):
        TALLY.op()
        with TALLY.inside(func.__name__):
            result = func(*_plain(args), **_plain(kwargs))
        return _counted(result)

    def __getitem__(self, index):
        if any(getattr(i, "dtype", None) == bool for i in (index if isinstance(index, tuple)
                                                            else (index,))):
            TALLY.sync()                                # a boolean mask: shape from the data
        with TALLY.inside("gather"):
            result = numpy.ndarray.__getitem__(self.view(numpy.ndarray), _plain(index))
        if isinstance(result, numpy.ndarray) and not _shares(result, self):
            TALLY.op()                                  # fancy index: a gather
        return _counted(result)

    def __setitem__(self, index, value):
        TALLY.op()                                      # a write through an index: a copy
        with TALLY.inside("write"):
            numpy.ndarray.__setitem__(self.view(numpy.ndarray), _plain(index), _plain(value))

    def copy(self, *args, **kwargs):
        TALLY.op()
        with TALLY.inside("copy"):
            return _counted(self.view(numpy.ndarray).copy(*args, **kwargs))

    def astype(self, dtype, *args, **kwargs):
        with TALLY.inside("astype"):
            result = self.view(numpy.ndarray).astype(dtype, *args, **kwargs)
        if not _shares(result, self):
            TALLY.op()
        return _counted(result)

    def reshape(self, *shape, **kwargs):
        with TALLY.inside("reshape"):
            result = self.view(numpy.ndarray).reshape(*shape, **kwargs)
        if not _shares(result, self):
            TALLY.op()                                  # not a view: a copy
        return _counted(result)

    def ravel(self, *args, **kwargs):
        with TALLY.inside("ravel"):
            result = self.view(numpy.ndarray).ravel(*args, **kwargs)
        if not _shares(result, self):
            TALLY.op()
        return _counted(result)

    def _reduction(name):
        def method(self, *args, **kwargs):
            TALLY.op()                                  # one reduction, as one kernel
            with TALLY.inside(name):
                result = getattr(self.view(numpy.ndarray), name)(*_plain(args), **_plain(kwargs))
            return _counted(result)
        method.__name__ = name
        return method

    mean, var, std = _reduction("mean"), _reduction("var"), _reduction("std")

    def _sync(name):
        def method(self, *args):
            TALLY.sync()
            return getattr(self.view(numpy.ndarray), name)(*args)
        method.__name__ = name
        return method

    __float__, __int__, __bool__, __index__ = (_sync("__float__"), _sync("__int__"),
                                               _sync("__bool__"), _sync("__index__"))
    item, tolist = _sync("item"), _sync("tolist")

    def nonzero(self):
        TALLY.op()
        TALLY.sync()                                    # the count of non-zeros: from the data
        with TALLY.inside("nonzero"):
            return _counted(self.view(numpy.ndarray).nonzero())


class CountingRNG:
    """A generator whose draws are counted operations returning counted arrays."""

    def __init__(self, generator):
        self._generator = generator

    def __getattr__(self, name):
        attr = getattr(self._generator, name)
        if not callable(attr):
            return attr

        def draw(*args, **kwargs):
            TALLY.op()
            with TALLY.inside(f"random.{name}"):
                return _counted(attr(*_plain(args), **_plain(kwargs)))
        return draw


def _counting_module(module, submodules=("random", "linalg")):
    """A stand-in for ``module`` whose functions count one operation per call."""
    stand_in = types.SimpleNamespace()
    for name in dir(module):
        if name.startswith("__"):
            continue
        attr = getattr(module, name)
        if isinstance(attr, types.ModuleType):
            if name in submodules:
                setattr(stand_in, name, _counting_module(attr, ()))
            continue
        if isinstance(attr, type) or not callable(attr):
            setattr(stand_in, name, attr)               # dtypes, ndarray, constants: as they are
            continue
        setattr(stand_in, name, _counting_function(attr))
    return stand_in


DATA_DEPENDENT_SHAPES = {"nonzero", "flatnonzero", "argwhere", "unique", "compress", "extract"}
ALLOCATIONS = {"empty", "empty_like"}        # no kernel: not an operation


def _counting_function(func):
    shape_from_data = getattr(func, "__name__", "") in DATA_DEPENDENT_SHAPES
    allocation = getattr(func, "__name__", "") in ALLOCATIONS

    def call(*args, **kwargs):
        if not allocation:
            TALLY.op()
        if shape_from_data:
            TALLY.sync()
        with TALLY.inside(call.__name__):
            result = func(*_plain(args), **_plain(kwargs))
        if isinstance(result, numpy.random.Generator):
            return CountingRNG(result)
        return _counted(result)
    call.__name__ = getattr(func, "__name__", "function")
    return call


@contextlib.contextmanager
def counting_backend():
    """Run the NumPy backend through the counting stand-in."""
    backend.use("numpy")
    saved = {name: getattr(backend, name) for name in ("xp", "to_device", "to_host", "dropout_keep")}
    original_to_device, original_keep = backend.to_device, backend.dropout_keep

    def to_device(array, dtype=None):
        if isinstance(array, Counted) and (dtype is None or array.dtype == dtype):
            return array
        TALLY.op()                                      # host -> device copy
        with TALLY.inside("to_device"):
            return _counted(original_to_device(_plain(array), dtype))

    def to_host(array):
        if isinstance(array, Counted):
            TALLY.sync()
        return _plain(array)

    def dropout_keep(generator, shape, p, raw=None):
        TALLY.op(2)                                     # draw, compare (as on any backend)
        with TALLY.inside("dropout_keep"):
            keep, scale = original_keep(getattr(generator, "_generator", generator), shape, p,
                                        raw)
        return _counted(keep), scale

    backend.xp = _counting_module(numpy)
    backend.to_device, backend.to_host, backend.dropout_keep = to_device, to_host, dropout_keep
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(backend, name, value)


MATRIX_PRODUCTS = {"matmul", "dot", "tensordot"}


def clocked(make_step, steps: int, warmup: int = 1) -> collections.Counter:
    """Seconds per step of every array operation, by (phase, module, operation name).

    ``make_step()`` builds the step's state (so that its arrays are the stand-in's) and returns a
    function running one step; ``warmup`` steps run untimed first. Each operation is timed around
    the NumPy call alone: the stand-in's own Python overhead is not in the figures.
    """
    with counting_backend():
        step = make_step()
        for _ in range(warmup):
            step()
        TALLY.clock = collections.Counter()
        try:
            for _ in range(steps):
                step()
            seconds = TALLY.clock
        finally:
            TALLY.clock = None
    return collections.Counter({key: s / steps for key, s in seconds.items()})


def split_seconds(seconds: collections.Counter) -> tuple[float, collections.Counter]:
    """(seconds in matrix products, the other operations' seconds by module)."""
    products, others = 0.0, collections.Counter()
    for (_, module, name), s in seconds.items():
        if name in MATRIX_PRODUCTS:
            products += s
        else:
            others[module] += s
    return products, others
