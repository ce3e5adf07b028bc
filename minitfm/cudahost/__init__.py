"""CUDA C kernels executed on the CPU: a fused kernel's own source, run without a GPU.

Host-only code: it runs a kernel over NumPy arrays. ``HostKernel(source, name)`` takes what
``cupy.RawKernel`` takes and is called as it is, ``kernel(grid, block, args)``: ``args`` are
arrays (a device array's data pointer, here a NumPy array's, C-contiguous) and NumPy scalars of
the kernel's parameter types (as CuPy passes them: ``numpy.int32`` for an ``int``; a Python int
would reach a device as 64 bits, and is refused). The source is rewritten a little
(:mod:`minitfm.cudahost.rewrite`), compiled by the machine's C++ compiler with the header
``cuda_host.h`` and linked to its library ``cuda_host.cpp``, compiled once
(:mod:`minitfm.cudahost.build`; kept in a cache that heals itself, a cache that cannot be
written a :class:`CacheError`), and run by their model of CUDA:

- the grid's blocks run one after another; each thread of a block is a fiber with a stack of its
  own, ``threadIdx`` / ``blockIdx`` / ``blockDim`` / ``gridDim`` as CUDA defines them;
- ``__syncthreads()`` releases when every thread of the block waits at that same barrier;
  ``__shfl_*_sync``, ``__ballot_sync``, ``__any_sync``, ``__all_sync`` and ``__syncwarp``
  exchange through the warp once every lane of the mask has arrived; ``__shared__`` arrays are
  one copy per block, garbage at the block's start; atomics are their read and their write;
- ``a * b + c`` rounds twice (no contraction, as ``--fmad=false`` asks on a device), the math
  functions are the C library's (a device's differ by an ulp or two), the PTX half conversions
  are bit-exact host conversions.

What it finds, each a :class:`KernelFault` naming the kernel, the block, the thread and the
line: an element read or written outside its array (the array's own extent: a view of a larger
buffer ends where the view ends); two threads of a block touching an element, one of them
writing, with no barrier between them, or two blocks of one launch doing so (a race); a
``__shared__`` element read before any thread of the block wrote it; a barrier that can never
release (threads waiting at different barriers, a barrier that returned threads never reach, a
warp operation waiting for a lane that exited); an array of another type than its parameter
(at its first use: a placeholder the kernel never touches is fine, as on a device); with a
``time_limit``, a launch that runs longer, stopped, with the loop still going named (its
condition never turns false) and ``KernelFault.timed_out`` True; a failing ``assert`` and
``__trap()`` (which end a device's launch with an error), a thread's stack that overflows (it
holds 512 KiB of locals, a device thread's local memory at most), and what would crash the
process (a pointer that points nowhere, an integer division by zero): each stops the launch as
a fault of the thread under way, and the library can launch again. A fault inside a function
the kernel calls (``block_sum``) is named at the line of the kernel's body that called it, the
function's own line in the words: a learner's line, even when the barrier or the element at
fault is in the library's helper.
:func:`checked_launch` runs a launch in several orders of its blocks and threads (seeded: one
fixed order hides races) and demands the same bits from each, and compares the launch with a
reference (a kernel's plain twin).

What only a device shows: speed, occupancy and memory bandwidth; the ordering of memory between
blocks beyond "not at all" (fences, the memory model); the device's own math library and its
fused multiply-adds where a kernel asks for them; and everything about threads truly running at
the same time (a fiber runs until it waits, so a race the checks do not see, between two
accesses through different arrays over the same memory, stays hidden).
"""

from __future__ import annotations

import ctypes
import math
import time
import warnings

import numpy

from minitfm.cudahost import build as _build
from minitfm.cudahost.build import CacheError
from minitfm.cudahost.cxx import BuildError, CompilerError, compiler
from minitfm.cudahost.rewrite import Unsupported

__all__ = ["HostKernel", "KernelFault", "BuildError", "CompilerError", "CacheError",
           "Unsupported", "checked_launch", "compiler", "compare_outputs"]

MAX_THREADS, MAX_BLOCK_Z, MAX_GRID_YZ = 1024, 64, 65535


class KernelFault(RuntimeError):
    """A fault the host execution found: ``kernel``, ``block`` and ``thread`` ((x, y, z); thread
    None where the whole block is at fault), ``line`` of the kernel's source (0: unknown; a
    fault inside a function the kernel calls is at the line of the kernel's body that called
    it, the function's own line in the words), ``what`` the fault in words; ``timed_out`` True
    where the launch ran past its time limit (a loop that never ends), False for every other
    fault."""

    def __init__(self, kernel: str, what: str, block=None, thread=None, line: int = 0,
                 source: str = "", timed_out: bool = False):
        self.kernel, self.what, self.block, self.thread, self.line = kernel, what, block, \
            thread, line
        self.timed_out = timed_out
        where = f"kernel {kernel}"
        if block is not None:
            where += f", block ({block[0]}, {block[1]}, {block[2]})"
        if thread is not None:
            where += f", thread ({thread[0]}, {thread[1]}, {thread[2]})"
        text = f"{where}: {what}"
        lines = source.splitlines()
        if 0 < line <= len(lines):
            text += f"\n    line {line} of the kernel's source: {lines[line - 1].strip()}"
        super().__init__(text)


class _Region(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("count", ctypes.c_longlong),
                ("size", ctypes.c_longlong), ("name", ctypes.c_char_p),
                ("shared", ctypes.c_longlong), ("shadow", ctypes.c_void_p),
                ("mismatch", ctypes.c_char_p)]


class _Config(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("seed", ctypes.c_ulonglong), ("fibers", ctypes.c_longlong),
                ("time_limit", ctypes.c_double), ("time_spent", ctypes.c_double)]


class _Fault(ctypes.Structure):
    _fields_ = [("message", ctypes.c_char * 4096), ("block", ctypes.c_longlong * 3),
                ("thread", ctypes.c_longlong * 3), ("line", ctypes.c_longlong),
                ("timed_out", ctypes.c_longlong)]


def _limit(time_limit) -> float:
    """A time limit in seconds as the launch takes it (0.0: none)."""
    if time_limit is None:
        return 0.0
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or \
            not 0 < time_limit < math.inf:
        raise ValueError(f"time_limit must be a positive number of seconds, or None for no "
                         f"limit, got {time_limit!r}")
    return float(time_limit)


def _dims(value, what: str) -> tuple[int, int, int]:
    dims = tuple(value) if isinstance(value, tuple) else None
    if not dims or len(dims) > 3 or not all(isinstance(d, int) and d > 0 for d in dims):
        raise ValueError(f"{what} must be a tuple of 1 to 3 positive ints, got {value!r}")
    return dims + (1,) * (3 - len(dims))


class HostKernel:
    """Kernel ``name`` of the CUDA C ``source``, executed on the CPU (see the module's
    docstring); compiled on first use, as ``cupy.RawKernel`` is."""

    def __init__(self, source: str, name: str):
        self.source, self.name = source, name
        self._library = None

    @property
    def library(self):
        if self._library is None:
            library = _build.build(self.source)
            if self.name not in library.host.kernels:
                raise Unsupported(f"no kernel named {self.name!r} in the source (it has "
                                  f"{', '.join(library.host.kernels)})")
            self._entry = library.entry(self.name)
            self._library = library
        return self._library

    @property
    def params(self) -> tuple:
        return self.library.host.kernels[self.name]

    def __call__(self, grid, block, args, *, shared_mem: int = 0, seed: int = 0,
                 races: bool = True, time_limit: float | None = None) -> None:
        """Run the kernel over ``args`` (written in place). ``seed`` 0 runs the blocks and each
        block's threads in their natural order, another seed in an order drawn from it;
        ``races`` False skips the race checks (bounds are always checked); ``time_limit``
        (seconds; None: none) stops a launch that runs longer, a :class:`KernelFault` with
        ``timed_out`` True naming the loop still going."""
        self._run(grid, block, args, shared_mem, seed, races, _limit(time_limit), 0.0)

    def _run(self, grid, block, args, shared_mem: int, seed: int, races: bool,
             time_limit: float, time_spent: float) -> None:
        """``__call__``, with ``time_limit`` (0.0: none) shared with launches before this one
        that took ``time_spent`` seconds."""
        grid, block = _dims(grid, "grid"), _dims(block, "block")
        if math.prod(block) > MAX_THREADS or block[2] > MAX_BLOCK_Z or max(grid[1:]) > MAX_GRID_YZ:
            raise ValueError(f"kernel {self.name}: grid {grid} and block {block} are not a valid "
                             f"launch (at most {MAX_THREADS} threads a block, {MAX_BLOCK_Z} in z; "
                             f"grid y and z at most {MAX_GRID_YZ}: cudaErrorInvalidValue)")
        if shared_mem:
            raise Unsupported(f"kernel {self.name}: dynamic shared memory (shared_mem="
                              f"{shared_mem}) is not modelled by the host execution")
        params = self.params
        if not isinstance(args, tuple) or len(args) != len(params):
            raise TypeError(f"kernel {self.name} takes {len(params)} arguments "
                            f"({', '.join(p.name for p in params)}), got "
                            f"{len(args) if isinstance(args, tuple) else type(args).__name__}")
        keep, pointers = [], (ctypes.c_void_p * len(params))()
        for i, (param, arg) in enumerate(zip(params, args)):
            pointers[i] = self._argument(i, param, arg, races, keep)
        config = _Config((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block),
                         seed & (1 << 64) - 1, int(self.library.host.fibers), time_limit,
                         time_spent)
        fault = _Fault()
        with self.library.lock:
            failed = self._entry(ctypes.byref(config), pointers, ctypes.byref(fault))
        if failed:
            thread = tuple(fault.thread) if fault.thread[0] >= 0 else None
            raise KernelFault(self.name, fault.message.decode(errors="replace"),
                              tuple(fault.block), thread, int(fault.line), self.source,
                              bool(fault.timed_out))

    def _argument(self, i: int, param, arg, races: bool, keep: list) -> int:
        what = f"kernel {self.name}, argument {i} ({param.name}, {param.text}" \
               f"{'*' if param.pointer else ''})"
        if param.pointer:
            if not isinstance(arg, numpy.ndarray):
                raise TypeError(f"{what}: an array, got {type(arg).__name__}")
            if not arg.flags.c_contiguous:
                raise ValueError(f"{what}: a kernel reads its arrays as pointers: pass "
                                 f"C-contiguous arrays")
            mismatch = None
            if arg.dtype != numpy.dtype(param.dtype) and not (
                    param.dtype == "uint16" and arg.dtype == numpy.float16):
                mismatch = (f"the argument is a {arg.dtype} array and the parameter a "
                            f"{param.ctype}*: a device would read its bytes as "
                            f"{param.ctype}").encode()
            shadow = None
            if races:
                shadow = numpy.zeros(max(arg.size, 1) * self.library.shadow_bytes,
                                     dtype=numpy.uint8)
                keep.append(shadow)
            name = param.name.encode()
            region = _Region(arg.ctypes.data, arg.size, arg.itemsize, name, 0,
                             None if shadow is None else shadow.ctypes.data, mismatch)
            keep += [arg, region, name, mismatch]
            return ctypes.addressof(region)
        if not isinstance(arg, numpy.generic) or arg.dtype != numpy.dtype(param.dtype):
            given = arg.dtype if isinstance(arg, numpy.generic) else type(arg).__name__
            raise TypeError(f"{what}: pass numpy.{param.dtype}(...), got {given} (CuPy passes a "
                            f"value as its own type, whatever the parameter's)")
        value = numpy.array(arg)
        keep.append(value)
        return value.ctypes.data


# ---- checked launches: several orders, and a reference -------------------------------------------

def _spans(args) -> list[tuple[int, int]]:
    """The byte ranges the array arguments cover, overlapping ones merged."""
    ranges = sorted((a.ctypes.data, a.ctypes.data + a.nbytes) for a in args
                    if isinstance(a, numpy.ndarray) and a.nbytes)
    merged: list[list[int]] = []
    for start, end in ranges:
        if merged and start < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _memory(start: int, end: int) -> numpy.ndarray:
    return numpy.frombuffer((ctypes.c_char * (end - start)).from_address(start), dtype=numpy.uint8)


def _copies(args, spans) -> tuple[tuple, list[numpy.ndarray]]:
    """``args`` with every array a copy, arrays that share memory sharing it in the copy too."""
    buffers = [_memory(s, e).copy() for s, e in spans]
    out = []
    for a in args:
        if not isinstance(a, numpy.ndarray):
            out.append(a)
        elif not a.nbytes:
            out.append(a.copy())
        else:
            k = next(k for k, (s, e) in enumerate(spans) if s <= a.ctypes.data < e)
            offset = a.ctypes.data - spans[k][0]
            out.append(numpy.frombuffer(buffers[k], dtype=a.dtype, count=a.size,
                                        offset=offset).reshape(a.shape))
    return tuple(out), buffers


def compare_outputs(result, reference) -> float:
    """How far ``result`` is from ``reference``: for floating arrays the largest difference
    relative to the largest finite value of the reference (equal infinities and NaNs agree);
    for other arrays 0.0 where every element is equal, else inf."""
    if result.dtype.kind != "f":
        return 0.0 if numpy.array_equal(result, reference) else math.inf
    a, b = result.astype(numpy.float64), reference.astype(numpy.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        diff = numpy.abs(a - b)
    diff[(a == b) | (numpy.isnan(a) & numpy.isnan(b))] = 0.0
    finite = numpy.abs(b[numpy.isfinite(b)])
    largest = float(diff.max(initial=0.0))
    return largest / max(float(finite.max(initial=0.0)), 1e-30) if largest == largest else math.inf


def checked_launch(kernel: HostKernel, grid, block, args, *, seeds=(0, 1), reference=None,
                   compare=None, shared_mem: int = 0, time_limit: float | None = None) -> dict:
    """Launch ``kernel`` once per seed of ``seeds`` (blocks and threads in the order each draws;
    0: the natural order), each on a copy of the arguments but the last, which writes ``args``;
    every run must leave the same bits, else :class:`KernelFault` (the result depends on the
    order of the threads: a race). ``time_limit`` (seconds; None: none) covers the launches
    together: past it, a :class:`KernelFault` with ``timed_out`` True. With ``reference`` (a
    function of the same arguments: a kernel's plain twin), return ``{parameter name:
    compare_outputs(kernel's, reference's)}`` for each array argument (``compare``: another
    function for the parameters it names); else ``{}``."""
    limit, spent = _limit(time_limit), 0.0
    spans = _spans(args)
    runs = [_copies(args, spans) for _ in seeds[:-1]]
    ref_args, _ = _copies(args, spans) if reference is not None else (None, None)
    for seed, copy in zip(seeds, [copy for copy, _ in runs] + [args]):
        started = time.monotonic()
        kernel._run(grid, block, copy, shared_mem, seed, True, limit, spent)
        spent += time.monotonic() - started
    for seed, (copy, buffers) in zip(seeds, runs):
        for (start, end), buffer in zip(spans, buffers):
            if not numpy.array_equal(buffer, _memory(start, end)):
                raise KernelFault(kernel.name, _order_difference(kernel, args, copy, seed,
                                                                 seeds[-1]))
    if reference is None:
        return {}
    reference(*ref_args)
    errors, seen = {}, set()
    for param, mine, theirs in zip(kernel.params, args, ref_args):
        if isinstance(mine, numpy.ndarray) and id(mine) not in seen:
            seen.add(id(mine))
            errors[param.name] = (compare or {}).get(param.name, compare_outputs)(mine, theirs)
    return errors


def _order_difference(kernel, args, copy, seed, last) -> str:
    for param, mine, other in zip(kernel.params, args, copy):
        if isinstance(mine, numpy.ndarray):
            rows = mine.size or 1
            differ = numpy.flatnonzero((mine.reshape(-1).view(numpy.uint8).reshape(rows, -1)
                                        != other.reshape(-1).view(numpy.uint8).reshape(rows, -1))
                                       .any(axis=1))
            if differ.size:
                i = int(differ[0])
                return (f"its results depend on the order its threads run in: {param.name}[{i}] "
                        f"is {mine.reshape(-1)[i]!r} in the order of seed {last} and "
                        f"{other.reshape(-1)[i]!r} in the order of seed {seed} (a race: a "
                        f"barrier missing, or threads of two blocks sharing an element)")
    return "its results depend on the order its threads run in (a race)"
