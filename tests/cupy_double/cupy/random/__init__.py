"""``cupy.random`` of the double: ``default_rng`` and CuPy's ``Generator``
(cupy/random/_generator_api.pyx, _bit_generator.pyx).

CuPy's Generator has only the methods below (no ``choice``, ``permutation``, ``shuffle``,
``normal``, ``bytes``...). Each generator made is counted (``cupy._double``: "generators"): on a
GPU it allocates and initialises ``8 * 256 * SM-count`` cuRAND XORWOW states (48 bytes each) with a
kernel, and the double allocates as much device memory. Seeds go through
``numpy.random.SeedSequence`` as CuPy's do; the draws are NumPy's, not cuRAND's.
"""

from __future__ import annotations

import numpy

from cupy import _double
from cupy._core import _out_arg, _wrap, ndarray
from cupy.cuda import _state

_XORWOW_STATE_BYTES = 48
_SM_COUNT = 132


class BitGenerator:
    def __init__(self, seed=None):
        if isinstance(seed, numpy.random.SeedSequence):
            self._seed_seq = seed
        else:
            if isinstance(seed, ndarray):
                seed = seed.get()
            self._seed_seq = numpy.random.SeedSequence(seed)
        self._current_device_id = _state.current_device()

    def _check_device(self):
        if _state.current_device() != self._current_device_id:
            raise RuntimeError("This Generator state is allocated in a different device")


class XORWOW(BitGenerator):
    def __init__(self, seed=None, *, size=-1):
        super().__init__(seed)
        if size < 0:
            size = 8 * 256 * _SM_COUNT
        self._size = size
        # the cuRAND states on the device (numpy.zeros: pages the host never touches)
        self._state = ndarray._make(numpy.zeros(_XORWOW_STATE_BYTES * size, numpy.int8), None)
        self._numpy = numpy.random.Generator(numpy.random.PCG64(self._seed_seq))
        _double.record("generators", "default_rng()")
        _double.launch("cuRAND state initialisation")


class Generator:
    """cupy/random/_generator_api.pyx Generator: its methods, with their parameters."""

    def __init__(self, bit_generator):
        self.bit_generator = bit_generator
        self._numpy = bit_generator._numpy

    def _draw(self, result, dtype=None, out=None):
        self.bit_generator._check_device()
        result = numpy.asarray(result)
        if dtype is not None:
            result = result.astype(dtype, copy=False)
        if out is not None:
            out = _out_arg(out)
            if out.dtype != result.dtype:
                raise TypeError(f"out dtype {out.dtype} differs from {result.dtype}")
            out._a[...] = result.reshape(out.shape)
            _double.launch()
            return out
        return _wrap(result)

    def random(self, size=None, dtype=numpy.float64, out=None):
        dtype = numpy.dtype(dtype)
        if dtype.char not in "fd":
            raise ValueError(f"Unsupported dtype {dtype.name} for random")
        size = out.shape if out is not None and size is None else size
        return self._draw(self._numpy.random(size, dtype=dtype), None, out)

    def integers(self, low, high=None, size=None, dtype=numpy.int64, endpoint=False):
        return self._draw(self._numpy.integers(low, high, size, dtype=dtype, endpoint=endpoint))

    def uniform(self, low=0.0, high=1.0, size=None, dtype=numpy.float64):
        return self._draw(self._numpy.uniform(low, high, size), dtype)

    def standard_normal(self, size=None, dtype=numpy.float64, out=None):
        size = out.shape if out is not None and size is None else size
        return self._draw(self._numpy.standard_normal(size, dtype=numpy.dtype(dtype)), None, out)

    def standard_exponential(self, size=None, dtype=numpy.float64, method="inv", out=None):
        size = out.shape if out is not None and size is None else size
        return self._draw(self._numpy.standard_exponential(size, dtype=numpy.dtype(dtype),
                                                           method=method), None, out)

    def standard_gamma(self, shape, size=None, dtype=numpy.float64, out=None):
        size = out.shape if out is not None and size is None else size
        return self._draw(self._numpy.standard_gamma(shape, size, dtype=numpy.dtype(dtype)),
                          None, out)

    def exponential(self, scale=1.0, size=None):
        return self._draw(self._numpy.exponential(scale, size))

    def beta(self, a, b, size=None, dtype=numpy.float64):
        return self._draw(self._numpy.beta(a, b, size), dtype)

    def binomial(self, n, p, size=None):
        return self._draw(self._numpy.binomial(n, p, size))

    def chisquare(self, df, size=None):
        return self._draw(self._numpy.chisquare(df, size))

    def dirichlet(self, alpha, size=None):
        return self._draw(self._numpy.dirichlet(alpha, size))

    def f(self, dfnum, dfden, size=None):
        return self._draw(self._numpy.f(dfnum, dfden, size))

    def gamma(self, shape, scale=1.0, size=None):
        return self._draw(self._numpy.gamma(shape, scale, size))

    def geometric(self, p, size=None):
        return self._draw(self._numpy.geometric(p, size))

    def hypergeometric(self, ngood, nbad, nsample, size=None):
        return self._draw(self._numpy.hypergeometric(ngood, nbad, nsample, size))

    def logseries(self, p, size=None):
        return self._draw(self._numpy.logseries(p, size))

    def poisson(self, lam=1.0, size=None):
        return self._draw(self._numpy.poisson(lam, size))

    def power(self, a, size=None):
        return self._draw(self._numpy.power(a, size))


def default_rng(seed=None):
    """cupy/random/_generator_api.pyx default_rng: ``Generator(XORWOW(seed))``."""
    return Generator(XORWOW(seed))
