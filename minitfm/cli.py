"""What the command lines share: the run directory, the model config from options, the backend
choice, each worker's placement (its GPU or its BLAS threads, ``--threads``) and the way
``main()`` reports errors and signals. The options themselves, their types and the trainers'
defaults are in :mod:`minitfm.options`.

``train_toy.py``, ``train_wmt.py`` and ``python -m minitfm.translate / average / plot`` are thin
front ends over the library; the glue they have in common lives here once, so that all behave
alike:

- an error prints one ``error:`` line and exits with the status of :mod:`minitfm.exits`, the
  one table for every command (2 bad usage or input, 1 a run-time failure); a file that cannot
  be written names the file and the reason;
- Ctrl-C, SIGTERM or SIGHUP outside training ends the command at once with one line
  (``interrupted``, ``stopped by SIGTERM``) and 128 + the signal's number (130, 143, 129); a
  training run stopped by a signal exits with the same status after saving its checkpoint;
- a training run holds its run directory (``--out``) for its whole length: a second run on it is
  refused at once (:func:`run_directory`, :class:`minitfm.training.rundir.RunDirectory`);
- started as several workers (``mpiexec -n N``), a signal to any of them stops all with that
  status, and an error or a Ctrl-C in one worker ends all of them (:func:`report_errors`).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import glob
import os
import signal
import sys
import time
from collections.abc import Callable

from minitfm import backend, distributed, exits, gradscale, limits, placement
from minitfm.speed import fused, rows
from minitfm.exits import UsageError
from minitfm.models.translator import Config
from minitfm.options import Words
from minitfm.training.rundir import RunDirectory
from minitfm.training.state import TrainState, config_field
from minitfm.training.stops import StopRequests, describe_signal, raise_if_lost

__all__ = ["EXIT_INTERRUPTED", "reuse_freed_memory", "select_backend", "placement_defaults",
           "place", "run_defaults", "default_run_dir", "run_directory", "model_config",
           "stopped", "report_errors", "OutputFailed", "describe_stdout"]

# the default of --kernels where it is set (plain or fused), as MINITFM_BACKEND is --backend's
KERNELS_VARIABLE = "MINITFM_KERNELS"
EXIT_INTERRUPTED = exits.for_signal(signal.SIGINT)   # 130, the shell's code for Ctrl-C


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
    device, :func:`minitfm.backend.set_precision`), choose the fast path or the plain code
    (``--kernels``: on CuPy the fused kernels, :func:`minitfm.speed.fused.use`, plain by default; on
    NumPy the row passes on the worker's threads, :func:`minitfm.speed.rows.use`, the default), and
    print them as the run's first line
    (rank 0; not with ``announce=False``, for output that must be the command's text alone).
    Call it after the backend is chosen and before any array is made."""
    world = distributed.world()
    decided = placement.place(world, backend.name, threads=threads, cap=cap)
    try:
        chosen, why = backend.set_precision(precision)
    except backend.BackendError as exc:
        raise UsageError(f"--precision {precision}: {exc}") from exc
    on_cpu = backend.name == "numpy"
    from_environment = None             # "MINITFM_KERNELS=plain" where the variable chose them
    if kernels is None and os.environ.get(KERNELS_VARIABLE, "").strip():
        kernels = os.environ[KERNELS_VARIABLE].strip()
        from_environment = f"{KERNELS_VARIABLE}={kernels}"
        if kernels not in fused.CHOICES:
            raise UsageError(f"{KERNELS_VARIABLE}={kernels!r}: unknown kernels {kernels!r}: set "
                             f"it to {' or '.join(fused.CHOICES)}, or unset it")
    try:
        fused.use(kernels or ("fused" if on_cpu else "plain"))
    except backend.BackendError as exc:
        raise UsageError(f"{from_environment or f'--kernels {kernels}'}: {exc}") from exc
    rows.use(on_cpu and fused.choice() == "fused", decided.threads or 1)
    if announce and world.is_root:
        print(f"{decided.describe()}; precision {chosen} "
              f"({'--precision' if precision else why}){_fast_path(on_cpu, from_environment)}",
              flush=True)
    return decided


def _fast_path(on_cpu: bool, source: str | None = None) -> str:
    """The run's first line's last words: what runs outside the products (on the CPU, on how
    many threads), and what chose it (``source``: the environment variable, else the option);
    nothing for a GPU's plain code, its default."""
    if rows.enabled():
        loops = " with compiled loops" if rows.compiled() else ""
        return (f"; row passes on {placement.count(rows.threads(), 'thread')}{loops} "
                f"({source or '--kernels fused'})")
    if fused.choice() == "fused":
        return "; fused kernels"
    return f"; plain array code ({source or '--kernels plain'})" if on_cpu else ""


# ---- the run directory -----------------------------------------------------------------------

def run_defaults(kind: str) -> dict:
    """The default words of ``--out`` for a command whose runs are ``runs/KIND-<time>``."""
    return {"out": Words(f"runs/{kind}-<time>; with --resume, the newest runs/{kind}-*")}


def default_run_dir(kind: str, resume: bool) -> str:
    """A new ``runs/KIND-<time>``, or with ``resume`` the newest existing ``runs/KIND-*``."""
    if resume:
        existing = sorted(glob.glob(os.path.join("runs", f"{kind}-*")))
        if not existing:
            raise UsageError(f"--resume: no run directory runs/{kind}-* to resume; pass --out DIR")
        return existing[-1]
    return os.path.join("runs", f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}")


@contextlib.contextmanager
def run_directory(args: argparse.Namespace, kind: str):
    """Hold the run directory ``args.out`` (default :func:`default_run_dir`) for the block, from
    before anything in it is read or written to the end: one run per directory. Rank 0 takes it
    (and decides ``args.out``); the other workers go on once it has."""
    world = distributed.world()
    held = None
    if world.is_root:
        args.out = args.out or default_run_dir(kind, args.resume)
        held = RunDirectory.open(args.out, lock=not args.no_lock)
        if held.stale_removed:
            print(f"removed {held.stale_removed} temporary file(s) that a killed run left in "
                  f"{args.out}", file=sys.stderr, flush=True)
    try:
        args.out = world.broadcast_text(args.out or "")
        yield
    finally:
        if held is not None:
            held.close()


def model_config(preset: str, vocab_size: int, args: argparse.Namespace) -> Config:
    """The preset's config for a joint vocabulary of ``vocab_size``, with the model options given
    on the command line (``--layers``, ``--d-model``, ``--d-ff``, ``--heads``, ``--max-len``,
    ``--dropout``, ``--attention-dropout``, ``--relu-dropout``, ``--word-dropout``,
    ``--label-smoothing``, ``--pre-ln``; absent or None: the preset's value). A ``--max-len``
    whose position table cannot be held in memory is refused (:func:`limits.check_positions`):
    no sentence that long could be read, nor the model exported."""
    options = ("layers", "d_model", "d_ff", "heads", "max_len", "dropout", "attention_dropout",
               "relu_dropout", "word_dropout", "label_smoothing", "pre_ln")
    overrides = {config_field(option): getattr(args, option) for option in options
                 if getattr(args, option, None) is not None}
    try:
        cfg = Config.preset(preset, src_vocab=vocab_size, tgt_vocab=vocab_size, **overrides)
    except ValueError as exc:
        raise UsageError(f"model options: {exc}") from exc
    if "max_len" in overrides:
        limits.check_positions(cfg, f"--max-len {cfg.max_len}: the model's position table (the "
                                    f"rows a sentence that long reads, and the whole table an "
                                    f"export writes)", "--max-len")
    return cfg


def stopped(state: TrainState, out: str) -> int:
    """Say how to continue a run stopped by a signal; return its exit status, 128 + signal."""
    signum = state.stop_signal or signal.SIGINT
    how = describe_signal(signum)
    saved = (f"checkpoint {state.last_checkpoint} saved" if state.last_checkpoint
             else "no checkpoint saved")
    if distributed.world().is_root:
        print(f"{how} at step {state.step}; {saved}; continue with the same options and "
              f"--out {out} --resume", flush=True)
    return 128 + signum


def report_errors(run: Callable[[], int], sizes: str | None = None) -> int:
    """``run()``'s exit status; an error in the table of :mod:`minitfm.exits` prints one
    ``error: ...`` line and gives its status there (2 bad usage or input, 1 a run-time failure);
    out of memory, it names the device, its memory and ``sizes``, the options to lower.

    Signals: while ``run()`` runs, SIGINT, SIGTERM and SIGHUP end it at once where they arrive
    (as a KeyboardInterrupt; a block under ``minitfm.training.stops.interrupts_deferred``, such
    as a save, finishes first), with one line (``interrupted``, ``stopped by SIGTERM``) and
    status 128 + the signal's number; later signals are ignored while it ends. A training loop
    inside takes its signals itself (it saves a checkpoint), and so does any code that catches
    them.

    As one of several workers, ``run()`` returns on all of them together (done, or stopped by a
    signal they agreed on; see :mod:`minitfm.training.loop`), and they finish together. An error
    or a signal in one worker, where the others may be waiting for it in a collective, ends
    every worker with this status (``World.fail_together``), after the message."""
    world = distributed.world()
    with world.fail_together(), StopRequests() as requests, _guarded_stdout():
        try:
            status = run()
            sys.stdout.flush()                  # what is still buffered: its failure is ours
        except KeyboardInterrupt:
            requests.stopping()
            signum = requests.signum or signal.SIGINT
            print(describe_signal(signum), file=sys.stderr, flush=True)
            return _failed(world, exits.for_signal(signum))
        except Exception as exc:
            if _output_failed(exc):
                return _failed(world, exits.for_signal(signal.SIGPIPE) if exc.errno == errno.EPIPE
                               else exits.FAILED)
            status = exits.status_of(exc)
            if status is None:
                raise                   # not a user's error: a bug, shown with its traceback
            print(exits.message(exc, sizes), file=sys.stderr, flush=True)
            return _failed(world, status)
        world.finish()
        return status


class OutputFailed(OSError):
    """Standard output could not take what a command wrote (a full disk, a closed pipe)."""


class _Guarded:
    """A text stream whose failed writes raise :class:`OutputFailed`: an ``OSError`` from
    standard output says which stream it is (the stream's own says no name)."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        raise_if_lost()                 # a Ctrl-C lost on its way stops a command that prints
        try:
            return self.stream.write(text)
        except OSError as exc:
            raise OutputFailed(exc.errno, exc.strerror or str(exc)) from exc

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as exc:
            raise OutputFailed(exc.errno, exc.strerror or str(exc)) from exc

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextlib.contextmanager
def _guarded_stdout():
    """``sys.stdout`` guarded (:class:`_Guarded`) for the block, as it was after it."""
    stream = sys.stdout
    sys.stdout = _Guarded(stream)
    try:
        yield
    finally:
        sys.stdout = stream


def _output_failed(exc: Exception) -> bool:
    """Whether ``exc`` is standard output failing. Then one line says so, unless its reader went
    away (``| head``: a closed pipe ends the command quietly, as it ends ``yes``), and stdout is
    pointed at /dev/null, so that nothing more fails on the way out."""
    if not isinstance(exc, OutputFailed):
        return False
    if exc.errno != errno.EPIPE:
        print(f"error: cannot write to {describe_stdout()}: {exc.strerror}. Nothing is lost: no "
              f"file was written or changed by what went there. Send the output where there is "
              f"room (> a file on a disk with free space) and run the command again",
              file=sys.stderr, flush=True)
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return True


def describe_stdout() -> str:
    """"standard output", with what it is written to where the system says and it is a file or
    a device ("standard output (/dev/full)")."""
    try:
        target = os.readlink(f"/proc/self/fd/{sys.stdout.fileno()}")
    except (OSError, ValueError, AttributeError):
        return "standard output"
    return f"standard output ({target})" if target.startswith("/") else "standard output"


def _failed(world: distributed.World, status: int) -> int:
    """``status``, or as one of several workers, the end of all of them with it."""
    if world.distributed:
        raise SystemExit(status)        # fail_together: MPI_Abort with this status
    return status
