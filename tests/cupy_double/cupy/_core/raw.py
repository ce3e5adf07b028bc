"""``cupy.RawKernel`` of the double (cupy/_core/raw.pyx): made with CuPy's parameters and checks,
never run. The double cannot compile or run CUDA C++: calling a kernel raises. A library that
keeps a plain *twin* of each kernel (a function of the kernel's arguments computing its outputs
with array operations) runs it through :func:`cupy._double.emulate`, which checks the launch as
CuPy would and counts it as one launch."""

from __future__ import annotations

import numpy

from cupy import _double

_BACKENDS = ("nvrtc", "nvcc")


class RawKernel:
    """cupy/_core/raw.pyx ``RawKernel(str code, str name, tuple options=(), str backend='nvrtc',
    bool translate_cucomplex=False, *, bool enable_cooperative_groups=False, jitify=...)``
    (jitify: None in 14.2.0, False in 13.6.0); Cython refuses arguments of another type."""

    def __init__(self, code, name, options=(), backend="nvrtc", translate_cucomplex=False, *,
                 enable_cooperative_groups=False, jitify=None if _double.RULES >= 14 else False):
        for value, what, kind in ((code, "code", str), (name, "name", str),
                                  (options, "options", tuple), (backend, "backend", str)):
            if not isinstance(value, kind):
                raise TypeError(f"Argument '{what}' has incorrect type (expected {kind.__name__}, "
                                f"got {type(value).__name__})")
        if backend not in _BACKENDS:
            # cupy/cuda/compiler.py _compile_module_with_cache: ValueError('Invalid backend %s')
            raise ValueError(f"Invalid backend {backend}")
        self.code, self.name, self.options, self.backend = code, name, options, backend
        self.enable_cooperative_groups = enable_cooperative_groups

    def __call__(self, grid, block, args, *, shared_mem=0):
        check_launch(grid, block, args)
        raise NotImplementedError(
            f"the CuPy double cannot compile or run CUDA C++ (kernel {self.name!r}): run its "
            f"plain twin through cupy._double.emulate")


def check_launch(grid, block, args) -> None:
    """What CuPy's ``RawKernel.__call__`` (cupy/cuda/function.pyx ``_launch``) needs: grid and
    block tuples of at most 3 positive ints (block: at most 1024 threads), args a tuple. The
    double is stricter on the arguments: device arrays of the current device, or NumPy scalars
    (a Python int would reach the kernel as a 64-bit integer, a float as a double, whatever the
    kernel's parameter is)."""
    from cupy._core import _check_device, ndarray
    for what, dims in (("grid", grid), ("block", block)):
        if not isinstance(dims, tuple) or not 1 <= len(dims) <= 3 or not all(
                isinstance(d, int) and d > 0 for d in dims):
            raise ValueError(f"{what} must be a tuple of 1 to 3 positive ints, got {dims!r}")
    if int(numpy.prod(block)) > 1024:
        raise ValueError(f"block {block} has more than 1024 threads (cudaErrorInvalidValue)")
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple, got {type(args).__name__}")
    for arg in args:
        if isinstance(arg, ndarray):
            _check_device(arg)
            if not arg._a.flags.c_contiguous:
                raise ValueError("a kernel reads its arrays as pointers: pass C-contiguous "
                                 "arrays (cupy.ascontiguousarray)")
        elif not isinstance(arg, numpy.generic):
            raise TypeError(f"kernel argument {arg!r} of type {type(arg).__name__}: pass device "
                            f"arrays and NumPy scalars of the kernel's parameter types")
