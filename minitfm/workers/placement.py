"""Where each worker runs: its own GPU, or its share of the CPU's cores, decided once for every
command.

On a GPU (CuPy), worker ``local_rank`` of the ``local_size`` workers on its machine takes CUDA
device ``local_rank``; more workers than devices on one machine is refused (two workers on one
device would share it, and NCCL refuses a communicator with a device twice).

On the CPU (NumPy), the matrix products run in the BLAS library's threads. Workers that start
one thread per core each, several workers on one machine, put two threads on every core; a
thread that spins waiting for its partner while the core is taken makes every step several times
slower (the two-worker Multi30k command of docs/results.md: 2.6x). How many threads, first rule
that applies:

1. ``--threads N`` on the command line;
2. ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` or ``OMP_NUM_THREADS`` set in the environment
   (the first one set, in that order): the user's own choice;
3. the cores this process may use (``os.sched_getaffinity``; ``os.cpu_count()`` where that is
   missing) divided by the workers on this machine, at least 1, and at most the command's own
   default where it has one (``train_toy.py``'s small models gain nothing from a second
   thread; ``train_lm.py --sample`` neither).

The number is applied with threadpoolctl before the first matrix product, and the row passes
outside the products (:mod:`minitfm.speed.rows`, chosen by ``cli.place``) use as many; :func:`place`
returns it, with the reason, as a :class:`Placement` whose :meth:`~Placement.describe` is the
``placement: ...`` line every trainer prints first.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass

from minitfm.workers import devices

__all__ = ["PlacementError", "Placement", "THREAD_VARIABLES", "available_cores", "blas_threads",
           "blas_threads_within", "count", "place"]

# what the BLAS libraries read at start-up: OpenBLAS's own, MKL's own, then OpenMP's (both)
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")


class PlacementError(RuntimeError):
    """The workers cannot be placed as asked; the message says what to change."""


@dataclass(frozen=True)
class Placement:
    """What :func:`place` decided for this worker: ``gpu`` (its CUDA device, on CuPy) or
    ``threads`` (its BLAS threads, on NumPy), ``why`` in words, of ``local_size`` workers on this
    machine (``local_rank`` is this one)."""
    local_rank: int
    local_size: int
    why: str
    gpu: int | None = None
    gpu_name: str = ""
    threads: int | None = None

    def describe(self) -> str:
        """``placement: 2 workers on this machine, 1 BLAS thread each (2 cores / 2 workers)``,
        ``placement: 4 BLAS threads (OPENBLAS_NUM_THREADS=4)``, ``placement: GPU 1 (NVIDIA H100
        80GB HBM3) for local rank 1`` and the like."""
        workers = f"{self.local_size} workers on this machine, " if self.local_size > 1 else ""
        if self.gpu is not None:
            what = f"GPU {self.gpu} ({self.gpu_name}) for local rank {self.local_rank}"
        else:
            what = count(self.threads, "BLAS thread") + (" each" if self.local_size > 1 else "")
        return f"placement: {workers}{what} ({self.why})"


def available_cores() -> int:
    """The cores this process may run on (its affinity mask, which taskset, cgroups' cpusets and
    MPI launchers' binding narrow), or every core where the system cannot say."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def blas_threads(local_size: int, *, requested: int | None = None, cap: int | None = None,
                 environ: Mapping[str, str] = os.environ,
                 cores: int | None = None) -> tuple[int, str]:
    """``(threads, why)`` for one of ``local_size`` workers on this machine, by the module's
    rules: ``requested`` (``--threads``), else a thread variable of ``environ``, else ``cores``
    (default :func:`available_cores`) / ``local_size``, at least 1, at most ``cap``."""
    cores = available_cores() if cores is None else cores
    if requested is not None:
        if requested < 1:
            raise PlacementError(f"--threads {requested}: give 1 or more BLAS threads")
        return requested, _crowded("--threads", requested, local_size, cores)
    for variable in THREAD_VARIABLES:
        text = environ.get(variable, "").strip()
        if text:
            first = text.split(",")[0].strip()        # OpenMP allows a list, one per level
            if not first.isdigit() or int(first) < 1:
                raise PlacementError(
                    f"{variable}={text!r} is not a number of threads: set it to 1 or more, or "
                    f"unset it to give each worker its share of the cores (or pass --threads N)")
            return int(first), _crowded(f"{variable}={text}", int(first), local_size, cores)
    share = max(1, cores // max(local_size, 1))
    why = f"{count(cores, 'core')} / {count(local_size, 'worker')}"
    if cap is not None and share > cap:
        return cap, f"{why}, at most {cap} by default"
    return share, why


def count(n: int, thing: str) -> str:
    """``1 thread``, ``2 threads``."""
    return f"{n} {thing}{'s' if n != 1 else ''}"


def _crowded(why: str, threads: int, local_size: int, cores: int) -> str:
    """``why``, and where the threads of the workers on this machine outnumber its cores, so."""
    total = threads * local_size
    return why + (f"; {total} threads on {count(cores, 'core')}" if total > cores else "")


def limit_blas_threads(threads: int) -> None:
    """Make the BLAS library this process loaded (OpenBLAS, MKL, BLIS) use ``threads`` threads
    from now on."""
    import numpy  # noqa: F401  (no math: it loads the BLAS library, which the limit must reach)
    from threadpoolctl import threadpool_limits
    threadpool_limits(limits=threads, user_api="blas")


_blas_libraries = None        # threadpoolctl's handle on the loaded BLAS libraries, made once


@contextlib.contextmanager
def blas_threads_within(threads: int):
    """Inside the block the BLAS library uses ``threads`` threads, then as many as before: for a
    part of a step (a few microseconds each way, the library's own call; :func:`limit_blas_threads`
    looks the libraries up again, some 0.1 ms)."""
    global _blas_libraries
    if _blas_libraries is None:
        import numpy  # noqa: F401  (it loads the BLAS library, which the limit must reach)
        from threadpoolctl import ThreadpoolController
        _blas_libraries = ThreadpoolController().select(user_api="blas")
    with _blas_libraries.limit(limits=threads):
        yield


def place(world, backend_name: str, *, threads: int | None = None, cap: int | None = None,
          environ: Mapping[str, str] = os.environ) -> Placement:
    """Place this worker of ``world`` (a :class:`minitfm.workers.distributed.World`: its ``local_rank``
    and ``local_size``) for the active backend ``backend_name``: on ``"cupy"`` make GPU
    ``local_rank`` its device, else set its BLAS threads (``threads``: ``--threads``; ``cap``: the
    command's default at most, None for none). Call it once, before any array is made."""
    rank, size = world.local_rank, world.local_size
    if backend_name == "cupy":
        gpus = devices.device_count()
        if size > gpus:
            raise PlacementError(
                f"{size} workers on this machine but {count(gpus, 'GPU')}: "
                f"start one worker per GPU (mpiexec -n {gpus} on each machine)")
        devices.use_device(rank)
        return Placement(rank, size, f"one GPU per worker, {gpus} on this machine", gpu=rank,
                         gpu_name=devices.device_name(rank))
    n_threads, why = blas_threads(size, requested=threads, cap=cap, environ=environ)
    limit_blas_threads(n_threads)
    return Placement(rank, size, why, threads=n_threads)
