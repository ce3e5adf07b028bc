"""Where a command runs: the backend it chose, each worker's placement (its GPU or its BLAS
threads, ``--threads``), the precision of its products, the fast path or the plain code
(``--kernels``), and a process that keeps the memory of freed arrays. The options themselves are
in :mod:`minitfm.cli.options`.
"""

from __future__ import annotations

import ctypes
import os
import sys

from minitfm import backend, gradscale
from minitfm.backend import products
from minitfm.workers import distributed, placement
from minitfm.cli.exits import UsageError
from minitfm.cli.options import KERNELS, Words

__all__ = ["KERNELS_VARIABLE", "reuse_freed_memory", "select_backend", "placement_defaults",
           "place"]

# the default of --kernels where it is set (plain or fused), as MINITFM_BACKEND is --backend's
KERNELS_VARIABLE = "MINITFM_KERNELS"


# ---- memory ----------------------------------------------------------------------------------

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3     # glibc's mallopt parameters (malloc.h)


def reuse_freed_memory() -> bool:
    """Let the process keep the memory of freed arrays for the next step; True where it applies.

    A training step allocates and frees the same temporaries, a few MiB each, every time. By
    default glibc serves large allocations with fresh pages from the kernel (mmap above its
    threshold) and hands freed memory at the top of the heap back: every step then pays page
    faults for memory it had a moment ago -- a sixth of a small CPU model's time, as system time.
    Raising both thresholds keeps that memory in the process. Elsewhere (no glibc) nothing changes.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, 1 << 28) and mallopt(_M_TRIM_THRESHOLD, 1 << 30))


# ---- backend ---------------------------------------------------------------------------------

def select_backend(choice: str | None, default: str) -> str:
    """Activate ``--backend`` (else ``$MINITFM_BACKEND``, else ``default``); return it in words,
    saying why when ``auto`` fell back to NumPy."""
    backend.use(choice or backend.environment_choice(default))
    return backend.describe()


# ---- placement: each worker's GPU or CPU cores -----------------------------------------------

def placement_defaults(backend_default: str, threads_cap: int | None) -> dict:
    """The defaults of the placement options (options.PLACEMENT) for a command whose backend is
    ``backend_default`` and whose BLAS threads are at most ``threads_cap`` (None: every core this
    worker may use)."""
    share = "the cores this process may use / the workers on this machine"
    return {"backend": Words(f"$MINITFM_BACKEND, else {backend_default}"),
            "threads": Words(f"$OPENBLAS_NUM_THREADS, $MKL_NUM_THREADS or $OMP_NUM_THREADS if "
                             f"set, else {share}" + (f", at most {threads_cap}"
                                                     if threads_cap else "")),
            "loss_scale": gradscale.INITIAL_SCALE}


def place(threads: int | None, cap: int | None, precision: str | None = None,
          announce: bool = True, kernels: str | None = None) -> placement.Placement:
    """Place this worker (placement.place: its GPU, or its BLAS threads, from ``--threads``, the
    environment or its share of the cores, at most ``cap``) for the active backend, set the
    precision of its float32 products (``--precision``; None: the backend's default for its
    device, :func:`minitfm.backend.products.set_precision`), choose the fast path or the plain code
    (``--kernels``: on CuPy the fused kernels, :func:`minitfm.speed.fused.use`, plain by default; on
    NumPy the row passes on the worker's threads, :func:`minitfm.speed.rows.use`, the default), and
    print them as the run's first line
    (rank 0; not with ``announce=False``, for output that must be the command's text alone).
    Call it after the backend is chosen and before any array is made."""
    world = distributed.world()
    decided = placement.place(world, backend.name, threads=threads, cap=cap)
    try:
        chosen, why = products.set_precision(precision)
    except backend.BackendError as exc:
        raise UsageError(f"--precision {precision}: {exc}") from exc
    on_cpu = backend.name == "numpy"
    from_environment = None             # "MINITFM_KERNELS=plain" where the variable chose them
    if kernels is None and os.environ.get(KERNELS_VARIABLE, "").strip():
        kernels = os.environ[KERNELS_VARIABLE].strip()
        from_environment = f"{KERNELS_VARIABLE}={kernels}"
        if kernels not in KERNELS:
            raise UsageError(f"{KERNELS_VARIABLE}={kernels!r}: unknown kernels {kernels!r}: set "
                             f"it to {' or '.join(KERNELS)}, or unset it")
    chosen_kernels = kernels or ("fused" if on_cpu else "plain")
    if chosen_kernels == "fused" or chosen == "fp16" or "minitfm.speed" in sys.modules:
        # the fast paths: imported only by a run that may choose one (or set back to the plain
        # code where an earlier call of this process chose them)
        from minitfm.speed import fused, rows
        try:
            fused.use(chosen_kernels)
        except backend.BackendError as exc:
            raise UsageError(f"{from_environment or f'--kernels {kernels}'}: {exc}") from exc
        rows.use(on_cpu and chosen_kernels == "fused", decided.threads or 1)
    if announce and world.is_root:
        print(f"{decided.describe()}; precision {chosen} "
              f"({'--precision' if precision else why})"
              f"{_fast_path(on_cpu, chosen_kernels, from_environment)}", flush=True)
    return decided


def _fast_path(on_cpu: bool, kernels: str, source: str | None = None) -> str:
    """The run's first line's last words: what runs outside the products (on the CPU, on how
    many threads), and what chose it (``source``: the environment variable, else the option);
    nothing for a GPU's plain code, its default."""
    if kernels == "fused" and on_cpu:
        from minitfm.speed import rows
        loops = " with compiled loops" if rows.compiled() else ""
        return (f"; row passes on {placement.count(rows.threads(), 'thread')}{loops} "
                f"({source or '--kernels fused'})")
    if kernels == "fused":
        return "; fused kernels"
    return f"; plain array code ({source or '--kernels plain'})" if on_cpu else ""
