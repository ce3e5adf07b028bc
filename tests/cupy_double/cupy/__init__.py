"""A strict CuPy double for the tests: ``cupy`` on NumPy, as strict as CuPy is.

Never installed for users; the tests put ``tests/cupy_double`` first on ``sys.path``. It runs on
NumPy underneath but behaves as CuPy 14.2.0 (or 13.6.0, ``CUPY_DOUBLE_RULES=13``) does where
CuPy is stricter than NumPy: no implicit conversion to NumPy, no numpy.ndarray operands, CuPy's
signatures and keywords, every device-to-host copy counted (``cupy._double``), emulated devices
(``CUPY_DOUBLE_DEVICES``), NCCL over MPI. RULES.md lists each rule and the CuPy source it mirrors.
"""

import numpy as _numpy

from cupy import _double
from cupy import cuda  # noqa: F401
from cupy._core import ndarray, ufunc  # noqa: F401
from cupy._core.raw import RawKernel  # noqa: F401
from cupy._routines import *  # noqa: F401,F403
from cupy._routines import all, any, max, min, round, sum  # noqa: F401
from cupy import linalg, random  # noqa: F401,E402

__version__ = _double.VERSION

# dtypes and constants: NumPy's own objects, as CuPy re-exports them (cupy/__init__.py)
from numpy import (bool_, int8, int16, int32, int64, uint8, uint16, uint32, uint64,  # noqa: E402,F401
                   float16, float32, float64, complex64, complex128, intp, dtype, finfo, iinfo,
                   inf, nan, pi, e, newaxis, integer, floating, number, generic)

# the ufuncs (cupy/_math/*.py, cupy/_logic/*.py, cupy/_binary/elementwise.py)
_UFUNCS = """add subtract multiply true_divide floor_divide power remainder negative positive
absolute exp exp2 expm1 log log2 log10 log1p sqrt square sin cos tan tanh arctan sign floor ceil
rint maximum minimum fmax fmin isfinite isnan isinf logaddexp greater greater_equal less
less_equal equal not_equal logical_and logical_or logical_not logical_xor bitwise_and bitwise_or
bitwise_xor invert left_shift right_shift reciprocal sinh cosh arcsin arccos arctan2 hypot
copysign fmod""".split()
for _name in _UFUNCS:
    globals()[_name] = ufunc(_name, getattr(_numpy, _name))
divide = true_divide      # noqa: F821
abs = absolute            # noqa: F821
mod = remainder           # noqa: F821
del _name


def get_default_pinned_memory_pool():
    raise NotImplementedError("the double has no pinned memory")
