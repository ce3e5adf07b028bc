"""The array backend: NumPy on the CPU, CuPy on an NVIDIA GPU, one code base.

This is the only module of the library that imports numpy or cupy for array math. Everything
else reads the active array module as ``backend.xp`` *at call time* (never ``from ... import xp``,
which would freeze the module chosen at import time).

Choosing the backend
--------------------
- environment: ``MINITFM_BACKEND=numpy|cupy|auto`` (default ``numpy``; ``auto`` picks CuPy when
  ``cupy.is_available()``, else NumPy);
- in code: ``backend.use("cupy")``.

Asking for CuPy where it cannot run raises :class:`BackendError` saying why (not installed, or no
CUDA device). It never silently falls back to the CPU: ``auto`` records why it chose NumPy, and
:func:`describe` says so. The environment variable is read when ``xp`` or ``name`` is first
needed, not at import, so a bad value is reported where the commands report their errors.

What the layers need beyond the common NumPy/CuPy API lives here too: host<->device copies,
scatter-add (the embedding backward), seeded random generators (NumPy's on the CPU; on the GPU
the counter-based :mod:`minitfm.backend.philox`, which creates nothing on the device), the default float
dtype, and a check that catches host arrays handed to a GPU model (and the reverse).
"""

from __future__ import annotations

import contextlib
import os

import numpy

from minitfm.backend import philox    # the CuPy backend's generator: computes with the xp it is given

__all__ = [
    "BackendError", "xp", "name", "use", "using", "float_dtype", "set_float_dtype", "to_device", "to_host",
    "to_host_together", "is_host_array", "host_copy", "scatter_add", "sorted_scatter_add",
    "dropout_keep", "rng", "host_rng", "check_array", "is_gpu", "describe", "environment_choice",
    "memory_in_words",
]


class BackendError(RuntimeError):
    """The requested array backend cannot be used on this machine."""


# xp, the active array module, and name, its name, are set by use(); until then the module's
# __getattr__ selects the backend of MINITFM_BACKEND on first access.
_float_dtype = numpy.float32
_auto_fallback: str | None = None   # why "auto" chose NumPy, if it did
ENVIRONMENT_VARIABLE = "MINITFM_BACKEND"


def _load_cupy():
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise BackendError(
            "backend 'cupy' was requested but CuPy is not installed: install the GPU extra, "
            "e.g. `pip install -e '.[gpu]'` (CUDA 12) or `'.[gpu-cuda13]'` (CUDA 13), "
            f"or use MINITFM_BACKEND=numpy ({exc})") from exc
    try:
        available = cupy.is_available()
    except Exception as exc:  # pragma: no cover - depends on the machine
        raise BackendError(f"backend 'cupy' was requested but CUDA failed to initialise: {exc}") from exc
    if not available:
        raise BackendError(
            "backend 'cupy' was requested but no usable CUDA device was found "
            "(cupy.is_available() is False: check the driver and CUDA_VISIBLE_DEVICES), "
            "or use MINITFM_BACKEND=numpy")
    return cupy


def use(backend_name: str) -> None:
    """Make ``backend_name`` ("numpy", "cupy" or "auto") the active array backend."""
    global xp, name, _auto_fallback
    choice = backend_name.strip().lower()
    if choice not in ("numpy", "cupy", "auto"):
        raise BackendError(f"unknown backend {backend_name!r}: use 'numpy', 'cupy' or 'auto'")
    fallback = None
    if choice == "auto":
        try:
            module, chosen = _load_cupy(), "cupy"
        except BackendError as exc:
            module, chosen = numpy, "numpy"
            fallback = ("CuPy is not installed" if isinstance(exc.__cause__, ImportError)
                        else f"CuPy was found but cannot run: {exc}")
    elif choice == "cupy":
        module, chosen = _load_cupy(), "cupy"
    else:
        module, chosen = numpy, "numpy"
    xp, name, _auto_fallback = module, chosen, fallback


@contextlib.contextmanager
def using(backend_name: str):
    """``use(backend_name)`` for a block; the backend active before it is put back after."""
    previous = _active_name()
    use(backend_name)
    try:
        yield
    finally:
        use(previous)


def environment_choice(default: str = "numpy") -> str:
    """The backend named by ``MINITFM_BACKEND`` (``default`` when unset), checked."""
    value = os.environ.get(ENVIRONMENT_VARIABLE, "").strip() or default
    if value.lower() not in ("numpy", "cupy", "auto"):
        raise BackendError(f"{ENVIRONMENT_VARIABLE}={value!r}: unknown backend {value!r}: set it "
                           f"to numpy, cupy or auto, or unset it")
    return value


def __getattr__(attribute: str):
    """``xp`` and ``name`` before any use(): select the backend of the environment first."""
    if attribute in ("xp", "name"):
        use(environment_choice())
        return globals()[attribute]
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


def _active():
    """The active array module, selecting it from the environment on first use."""
    return globals()["xp"] if "xp" in globals() else __getattr__("xp")


def _active_name() -> str:
    _active()
    return globals()["name"]


def is_gpu() -> bool:
    return _active_name() == "cupy"


def describe() -> str:
    """The active backend in words: ``cupy (NVIDIA ...)``, ``numpy``, or with ``auto`` having
    fallen back, ``numpy (auto: CuPy is not installed)`` and the like."""
    if _active_name() == "cupy":
        try:
            return f"cupy ({_device()[1]})"
        except Exception:    # pragma: no cover - depends on the machine
            return "cupy"
    return f"numpy (auto: {_auto_fallback})" if _auto_fallback else "numpy"


def memory_in_words() -> str:
    """The memory the active backend's arrays live in, for a message that it ran out: ``GPU 0
    (NVIDIA A100-SXM4-40GB, 39.4 GiB)`` on CuPy, ``the host's memory`` on NumPy (and before any
    backend is chosen: none is chosen for it)."""
    if globals().get("name") != "cupy":
        return "the host's memory"
    try:
        device, name, properties = _device()
    except Exception:        # pragma: no cover - a device that fails to say (CUDARuntimeError)
        return "the GPU"
    return f"GPU {device} ({name}, {properties['totalGlobalMem'] / 2**30:.1f} GiB)"


def _device() -> tuple[int, str, dict]:
    """The current CUDA device: its id, its name and its properties."""
    cupy = _active()
    device = cupy.cuda.Device().id
    properties = cupy.cuda.runtime.getDeviceProperties(device)
    name = properties["name"]
    return device, name.decode() if isinstance(name, bytes) else name, properties


def float_dtype():
    """The default float dtype of new arrays: float32 (float64 for gradient checks)."""
    return _float_dtype


def set_float_dtype(dtype) -> None:
    global _float_dtype
    dtype = numpy.dtype(dtype)
    if dtype not in (numpy.float32, numpy.float64):
        raise ValueError(f"float dtype must be float32 or float64, got {dtype}")
    _float_dtype = dtype.type


def to_device(array, dtype=None):
    """Copy a host (NumPy) array, or anything array-like, to the active backend."""
    xp = _active()
    return xp.asarray(array, dtype=dtype)


def is_host_array(array) -> bool:
    """Whether ``array`` is a host (NumPy) array: on the NumPy backend, every array is."""
    return isinstance(array, numpy.ndarray)


def host_copy(array, what: str):
    """``array`` as a host array: itself if it is one, else a copy of an array of the active
    backend (which waits for the device); anything else is refused as ``check_array`` does."""
    return array if is_host_array(array) else to_host(check_array(array, what))


def to_host(array):
    """Copy an array of the active backend to a NumPy array (a no-op for NumPy arrays)."""
    if isinstance(array, numpy.ndarray):
        return array
    if hasattr(array, "get"):  # cupy.ndarray
        return array.get()
    return numpy.asarray(array)


def to_host_together(*arrays) -> list:
    """Copy several arrays of the active backend to the host in one device-to-host transfer.

    Each device-to-host copy waits for the device, so the numbers a step reads (a loss and a
    gradient norm, a beam's scores and token ids) travel together: on the GPU they are packed as
    float64 into one buffer (exact for float32/float64 values and for integers below 2**53),
    copied once, and unpacked with their own shapes and dtypes. Python numbers and host arrays
    pass through as NumPy arrays.
    """
    if _active_name() == "numpy" or all(not hasattr(a, "__cuda_array_interface__") for a in arrays):
        return [numpy.asarray(a) for a in arrays]
    xp = _active()
    packed = xp.concatenate([xp.asarray(a, dtype=xp.float64).reshape(-1) for a in arrays])
    host = to_host(packed)
    parts, offset = [], 0
    for a in arrays:
        shape, dtype = tuple(getattr(a, "shape", ())), getattr(a, "dtype", numpy.float64)
        size = int(numpy.prod(shape))
        parts.append(host[offset:offset + size].reshape(shape).astype(dtype))
        offset += size
    return parts


def scatter_add(target, indices, values) -> None:
    """``target[indices] += values`` with repeated indices accumulated, in a fixed order.

    ``indices`` is 1-D and indexes the first axis of ``target``; ``values`` has one row per index.
    The sums never depend on thread timing, so two runs (and a resumed run) agree bit for bit:
    NumPy's ``add.at`` adds the rows one after another; on a GPU, where an indexed add uses atomic
    additions in whatever order the threads arrive, :func:`sorted_scatter_add` is used instead.
    """
    if _active_name() == "numpy":
        numpy.add.at(target, indices, values)
    else:
        sorted_scatter_add(target, indices, values)


def sorted_scatter_add(target, indices, values) -> None:
    """``target[indices] += values`` as a segment sum over the sorted indices: no atomics, no
    data-dependent shapes (so no device-to-host synchronisation), the same result on every run.

        order = argsort(indices)            rows of equal index become one contiguous segment
        c     = 0, cumsum(values[order])    prefix sums in float64, c[k] = sum of the first k rows
        a, b  = where each row's segment starts and ends (binary search in the sorted indices)
        sum of the segment = c[b] - c[a]
    Every row of a segment writes its segment's sum to the segment's index; the writes to one
    place are all equal, so which lands last does not matter. (float64 prefix sums keep the
    difference exact to float32 precision.)
    """
    if indices.shape[0] == 0:
        return
    xp = _active()
    order = xp.argsort(indices)                                    # deterministic on each backend
    ids = indices[order]                                           # (N,) sorted
    prefix = xp.zeros((ids.shape[0] + 1,) + values.shape[1:], dtype=xp.float64)     # (N + 1, ...)
    xp.cumsum(values[order], axis=0, dtype=xp.float64, out=prefix[1:])
    start = xp.searchsorted(ids, ids, side="left")                 # (N,) its segment's first row
    end = xp.searchsorted(ids, ids, side="right")                  # (N,) one past its last row
    target[ids] += (prefix[end] - prefix[start]).astype(target.dtype, copy=False)


def dropout_keep(generator, shape, p: float, raw=None):
    """A keep mask for inverted dropout: ``(keep, scale)``.

    ``keep``: bool, True with probability 1 - p', p' = round(p * 2^16) / 2^16 (0.1 -> 0.100006),
    and ``scale = 1 / (1 - p')`` keeps the expectation exact. The mask compares 16-bit random
    integers with ``round(p * 2^16)``: a NumPy generator (:func:`rng`'s) draws the bytes of
    ``generator.bytes``, from its raw PCG64 outputs where they are whole (half the cost; by
    ``raw(bits, n)`` where given, the numbers of ``bits.random_raw(n)``); a Philox generator
    (:mod:`minitfm.backend.philox`, the CuPy backend's) takes two from each 32-bit word."""
    threshold, scale = philox.dropout_threshold(p)
    if isinstance(generator, numpy.random.Generator) and _active_name() == "numpy":
        size, bits = int(numpy.prod(shape)), generator.bit_generator
        if size % 4 or not isinstance(bits, numpy.random.PCG64) or bits.state["has_uint32"]:
            draws = numpy.frombuffer(generator.bytes(2 * size), dtype=numpy.uint16)
        else:   # bytes() takes each output's low, then high 32 bits: whole outputs, none left
            draws = (raw or type(bits).random_raw)(bits, size // 4).view(numpy.uint16)
        return draws.reshape(shape) >= threshold, scale
    if isinstance(generator, philox.Philox):
        return generator.keep(shape, threshold), scale
    raise TypeError(f"dropout on the {_active_name()} backend draws from a generator of "
                    f"minitfm.backend.rng(...), got {type(generator).__module__}."
                    f"{type(generator).__name__}")


def rng(seed: int, *stream: int):
    """A random generator of the active backend, reproducible from ``(seed, *stream)``.

    Dropout draws from ``rng(seed, step, i)`` for the i-th batch of an update: the masks depend
    only on the seed, the step and the batch's place in it, so a resumed run, or the same update
    split over several workers, draws exactly the masks one uninterrupted worker would.

    On NumPy it is ``numpy.random.default_rng([seed, *stream])``. On CuPy it is a
    :class:`~minitfm.backend.philox.Philox` generator keyed on ``(seed, *stream)``: its numbers are a
    function of the key and their place in the stream, computed with array operations, so making
    one costs nothing on the device (a CuPy generator would allocate and initialise a cuRAND
    state per GPU thread, for every batch). The two backends draw different masks from one seed.
    """
    if _active_name() == "cupy":
        return philox.Philox.seeded(seed, *stream, xp=_active())
    return numpy.random.default_rng([int(seed), *[int(s) for s in stream]])


def host_rng(seed: int, *stream: int) -> numpy.random.Generator:
    """A NumPy generator for host-side randomness (initialisation, data shuffling).

    Parameters are initialised on the host and copied to the device, so a seed gives the same
    model on the CPU and on the GPU.
    """
    return numpy.random.default_rng([int(seed), *[int(s) for s in stream]])


def check_array(array, what: str):
    """Raise a clear error unless ``array`` lives on the active backend; return it.

    Catches host/device mixing: a NumPy array handed to a CuPy model, or a CuPy array handed to
    a NumPy one.
    """
    xp = _active()
    if isinstance(array, xp.ndarray):
        return array
    where = "the GPU" if hasattr(array, "__cuda_array_interface__") else "the host"
    kind = f"{type(array).__module__}.{type(array).__name__}"
    raise TypeError(
        f"{what} is a {kind} on {where}, but the active backend is {_active_name()!r}: "
        f"move it with minitfm.backend.to_device(...) (or to_host(...)), or switch the backend "
        f"with minitfm.backend.use(...) / MINITFM_BACKEND")

