"""``cupy.linalg`` of the double (cupy/linalg/_norms.py, _einsum.py, _product.py)."""

from __future__ import annotations

import numpy

from cupy._core import _array_arg, _wrap
from cupy import _double

if _double.RULES >= 14:      # cupy.linalg.matmul: new in CuPy 14
    from cupy._routines import matmul  # noqa: F401


def norm(x, ord=None, axis=None, keepdims=False):
    """cupy/linalg/_norms.py norm: a 0-d device array for a full norm (no copy to the host)."""
    x = _array_arg(x, "x")
    return _wrap(numpy.asarray(numpy.linalg.norm(x._a, ord, axis, keepdims)))
