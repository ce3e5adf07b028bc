"""Fused GPU kernels, each beside the plain array code it replaces: the choice, and how one runs.

On a GPU every array operation is a kernel launch (10-30 us of host time each, whatever the
array's size) and a round trip through device memory. A layer written as plain array code, which
is what a learner reads and what NumPy runs, costs a few launches per line; a *fused kernel*
computes the same thing in one launch, reading its inputs once. Each fused kernel here is CUDA
C++ source in the fast-path file of the layer it serves (``speed/dropout.py``,
``speed/layernorm.py``, ``speed/softmax.py``, ``speed/feedforward.py``, ``speed/residual.py``,
``speed/loss.py``, ``speed/linear.py``, ``speed/optim.py``, ``speed/gradscale.py``); the plain
code in ``layers/`` stays the reference: a kernel has a *twin*, a function of the kernel's own
arguments that computes its outputs with the plain array code, the plain functions imported.

``--kernels fused|plain`` chooses (:func:`use`); on CuPy ``plain`` is the default until a run on
a real GPU has shown every kernel equal to its twin (``python -m minitfm.kernelcheck``, ``pytest
-m gpu``). Fused kernels run on CuPy only, on float32 arrays; on NumPy ``fused`` chooses the CPU's
fast path instead, the row passes of :mod:`minitfm.speed.rows` (the default there), and float64
(the gradient checks) runs the plain code whatever the choice (:mod:`minitfm.speed.policy`).

A :class:`Kernel` is compiled by CuPy (``cupy.RawKernel``, NVRTC) on first use, once per device,
with ``--fmad=false`` so that ``a * b + c`` rounds twice, as the plain code's two operations do.
Where CuPy cannot run CUDA C++ (the test suite's CuPy double), the twin runs in its place and
counts as one launch, so every command runs end to end and the launch counts are the kernel's;
or, where the double is asked to (``CUPY_DOUBLE_KERNELS=host``), the kernel's own source runs.

Without a GPU the kernels' own source runs on the CPU (:mod:`minitfm.cudahost`, compiled by the
machine's C++ compiler): ``use("fused", on_host=True)`` on the NumPy backend, which is what
``python -m minitfm.kernelcheck --host`` does, each launch then held to its twin.
"""

from __future__ import annotations

import math

from minitfm import backend, cudahost
from minitfm.speed import policy

__all__ = ["CHOICES", "use", "choice", "on_host", "active", "Kernel", "KERNELS", "OPTIONS",
           "HALF_CONVERSIONS", "grid_for", "THREADS", "BLOCK_REDUCE", "i32", "i64", "u32", "u64", "f32", "f64"]

CHOICES = ("plain", "fused")
OPTIONS = ("--std=c++14", "--fmad=false")
THREADS = 256                   # threads per block, for every kernel here

_choice = "plain"
_on_host = False        # the kernels' source runs on the CPU (minitfm.cudahost), over NumPy arrays


def use(kernels: str, on_host: bool = False) -> None:
    """Run the fused kernels (``"fused"``) or the plain array code (``"plain"``); ``on_host``:
    the fused kernels' CUDA source executed on the CPU, over the NumPy backend's arrays, each
    launch held to its twin (:meth:`Kernel.run_on_host`)."""
    global _choice, _on_host
    if kernels not in CHOICES:
        raise backend.BackendError(f"unknown kernels {kernels!r}: use plain or fused")
    if kernels == "fused" and on_host and backend.is_gpu():
        raise backend.BackendError("the kernels run on the host over NumPy arrays (the numpy "
                                   "backend); on the cupy backend they run on the GPU")
    _choice, _on_host = kernels, kernels == "fused" and on_host


def choice() -> str:
    return _choice


def on_host() -> bool:
    """Whether the fused kernels run on the CPU (see :func:`use`)."""
    return _on_host


def active(*arrays) -> bool:
    """Whether a layer given ``arrays`` runs its fused kernel: ``--kernels fused``, on CuPy (or
    on NumPy with the kernels on the host), with float32 arrays (float64, the gradient checks'
    type, always runs the plain code)."""
    if _choice != "fused" or policy.plain_here() or not (_on_host or backend.is_gpu()):
        return False
    float32 = backend.xp.float32
    return all(a.dtype == float32 for a in arrays)


# A kernel's scalar arguments, typed as its C parameters: int, long long, unsigned int,
# unsigned long long, float, double (a plain Python number would reach it as 64 bits).
def i32(value): return backend.xp.int32(value)           # noqa: E704
def i64(value): return backend.xp.int64(value)           # noqa: E704
def u32(value): return backend.xp.uint32(value)          # noqa: E704
def u64(value): return backend.xp.uint64(value)          # noqa: E704
def f32(value): return backend.xp.float32(value)         # noqa: E704
def f64(value): return backend.xp.float64(value)         # noqa: E704


def grid_for(n: int, per_thread: int = 1) -> tuple[int]:
    """The grid of a kernel with one thread per ``per_thread`` of ``n`` elements."""
    return (max(1, math.ceil(n / (per_thread * THREADS))),)


# Half precision without cuda_fp16.h (which NVRTC does not ship): 16-bit words converted with the
# PTX instructions that header's __half2float and __float2half_rn use (round to nearest even).
HALF_CONVERSIONS = r"""
typedef unsigned short half_bits;
__device__ __forceinline__ float half_to_float(half_bits h) {
    float f; asm("{cvt.f32.f16 %0, %1;}" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ half_bits float_to_half(float f) {
    half_bits h; asm("{cvt.rn.f16.f32 %0, %1;}" : "=h"(h) : "f"(f)); return h;
}
"""

# Block-wide reductions for the row kernels (one block of THREADS threads per row): every thread
# passes its partial value and gets the block's total; ``scratch`` is __shared__ float[32].
BLOCK_REDUCE = r"""
__device__ float block_sum(float v, float* scratch) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();                                  // scratch is free again
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (blockDim.x >> 5) ? scratch[lane] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    return scratch[0];
}
__device__ float block_max(float v, float* scratch) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (blockDim.x >> 5) ? scratch[lane] : __int_as_float(0xff800000);
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
        if (lane == 0) scratch[0] = v;
    }
    __syncthreads();
    return scratch[0];
}
"""

def _by_sum(result, reference) -> float:
    """How far two arrays of partial sums are apart in their totals (float64 sums)."""
    totals = [a.sum(dtype="float64", keepdims=True) for a in (result, reference)]
    return cudahost.compare_outputs(*totals)


KERNELS: dict[str, "Kernel"] = {}      # every kernel, by name: what the compile check compiles


class Kernel:
    """One CUDA C++ kernel: ``name`` (its ``extern "C" __global__`` function), ``source`` (the
    whole translation unit) and ``twin``, a function of the same arguments that computes the
    same outputs with the plain array code. Calling ``kernel(grid, args)`` launches it (blocks
    of :data:`THREADS` threads; ``args`` as CuPy passes them: arrays, and NumPy scalars typed as
    the kernel's parameters). ``sums``: the parameters the twin fills in a layout of its own,
    equal to the kernel's in their sum only (the partial sums of a reduction, one a block)."""

    def __init__(self, name: str, source: str, twin, sums: tuple = ()):
        if name in KERNELS:
            raise ValueError(f"a kernel named {name!r} exists already")
        self.name, self.source, self.twin, self.sums = name, source, twin, tuple(sums)
        self._compiled: dict = {}          # (array module, device) -> cupy.RawKernel
        self.host = cudahost.HostKernel(source, name)     # the same source, on the CPU
        self.launches = 0                  # calls so far (the kernel check counts them)
        self.host_errors: dict = {}        # on the host: output -> worst distance from the twin
        KERNELS[name] = self

    def raw(self):
        """The ``cupy.RawKernel`` of this kernel on the current device (compiled on first call)."""
        cupy = backend.xp                   # kernels run on CuPy only (see active)
        key = (id(cupy), cupy.cuda.Device().id)
        if key not in self._compiled:
            self._compiled[key] = cupy.RawKernel(self.source, self.name, options=OPTIONS)
        return self._compiled[key]

    def __call__(self, grid: tuple, args: tuple, shared_mem: int = 0) -> None:
        self.launches += 1
        if _on_host:
            self.run_on_host(grid, (THREADS,), args, shared_mem=shared_mem, check=True)
            return
        raw, xp = self.raw(), backend.xp
        emulate = getattr(getattr(xp, "_double", None), "emulate", None)
        if emulate is not None:          # a CuPy that cannot run CUDA C++: the twin, one launch
            emulate(raw, grid, (THREADS,), args, self.run_twin, host=self.run_on_host)
            return
        raw(grid, (THREADS,), args, shared_mem=shared_mem)

    def run_twin(self, *args) -> None:
        """The twin on the kernel's arguments, with every layer it calls on its plain code."""
        with policy.plain():
            self.twin(*args)

    def run_on_host(self, grid: tuple, block: tuple, args: tuple, shared_mem: int = 0,
                    check: bool = False) -> None:
        """The kernel's source executed on the CPU over ``args`` (NumPy arrays and scalars), its
        threads in an order drawn from the launch's number. ``check``: also run it in its
        threads' natural order, on a copy, demanding the same bits, and hold its outputs to the
        twin's (run on another copy), keeping the worst distance of each in ``host_errors``."""
        if not check:
            self.host(grid, block, args, shared_mem=shared_mem, seed=self.launches)
            return
        by_sum = {name: _by_sum for name in self.sums}
        errors = cudahost.checked_launch(self.host, grid, block, args, seeds=(0, self.launches),
                                         reference=self.run_twin, compare=by_sum,
                                         shared_mem=shared_mem)
        for param, arg in zip(self.host.params, args):
            if param.name in errors:
                key = (param.name, str(arg.dtype))
                self.host_errors[key] = max(self.host_errors.get(key, 0.0), errors[param.name])

    def __repr__(self) -> str:
        return f"Kernel({self.name!r})"
