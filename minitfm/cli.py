"""What the command lines share: the run directory, the model config from options, the backend
choice, each worker's placement (its GPU or its BLAS threads, ``--threads``) and the way
``main()`` reports errors and signals. The options' types and the trainers' option groups are in
:mod:`minitfm.options`.

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
  refused at once (:func:`run_in_directory`, :class:`minitfm.rundir.RunDirectory`);
- started as several workers (``mpiexec -n N``), a signal to any of them stops all with that
  status, and an error or a Ctrl-C in one worker ends all of them (:func:`report_errors`).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from minitfm import (backend, checkpoint, distributed, exits, fused, optim, placement, stops,
                     train, usable)
from minitfm.exits import UsageError
from minitfm.models.translator import Config
from minitfm.options import add_kernels_option, add_precision_option, positive_int
from minitfm.rundir import RunDirectory

__all__ = ["EXIT_INTERRUPTED", "UsageError", "reuse_freed_memory", "add_backend_option",
           "select_backend", "add_threads_option", "place", "add_placement_options",
           "add_run_options", "default_run_dir", "run_in_directory", "check_resumable",
           "model_config", "lr_schedule", "stopped", "report_errors"]

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

def add_backend_option(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument("--backend", choices=("numpy", "cupy", "auto"), default=None,
                        help=f"array backend (default: $MINITFM_BACKEND, else {default})")


def select_backend(choice: str | None, default: str) -> str:
    """Activate ``--backend`` (else ``$MINITFM_BACKEND``, else ``default``); return it in words,
    saying why when ``auto`` fell back to NumPy."""
    backend.use(choice or backend.environment_choice(default))
    return backend.describe()


# ---- placement: each worker's GPU or CPU cores -----------------------------------------------

def add_threads_option(parser, cap: int | None) -> None:
    """``--threads N``: BLAS threads per worker on the CPU; ``cap``: the command's default at
    most (None: every core this worker may use)."""
    share = "the cores this process may use / the workers on this machine"
    parser.add_argument("--threads", type=positive_int, metavar="N",
                        help=f"BLAS threads per worker on the CPU (default: "
                             f"$OPENBLAS_NUM_THREADS, $MKL_NUM_THREADS or $OMP_NUM_THREADS if "
                             f"set, else {share}" + (f", at most {cap})" if cap else ")"))


def place(threads: int | None, cap: int | None, precision: str | None = None,
          announce: bool = True, kernels: str | None = None) -> placement.Placement:
    """Place this worker (placement.place: its GPU, or its BLAS threads, from ``--threads``, the
    environment or its share of the cores, at most ``cap``) for the active backend, set the
    precision of its float32 products (``--precision``; None: the backend's default for its
    device, :func:`minitfm.backend.set_precision`), choose the fused kernels or the plain code
    (``--kernels``, :func:`minitfm.fused.use`), and print them as the run's first line
    (rank 0; not with ``announce=False``, for output that must be the command's text alone).
    Call it after the backend is chosen and before any array is made."""
    world = distributed.world()
    decided = placement.place(world, backend.name, threads=threads, cap=cap)
    try:
        chosen, why = backend.set_precision(precision)
    except backend.BackendError as exc:
        raise UsageError(f"--precision {precision}: {exc}") from exc
    try:
        fused.use(kernels or "plain")
    except backend.BackendError as exc:
        raise UsageError(f"--kernels {kernels}: {exc}") from exc
    if announce and world.is_root:
        print(f"{decided.describe()}; precision {chosen} "
              f"({'--precision' if precision else why})"
              + ("; fused kernels" if fused.choice() == "fused" else ""), flush=True)
    return decided


def add_placement_options(group, backend_default: str, threads_cap: int | None) -> None:
    """``--backend``, ``--threads``, ``--precision`` and ``--kernels``: where a worker runs and
    how its products and layers are computed (:func:`place`)."""
    add_backend_option(group, backend_default)
    add_threads_option(group, threads_cap)
    add_precision_option(group)
    add_kernels_option(group)


# ---- the run directory -----------------------------------------------------------------------

def add_run_options(parser, kind: str) -> None:
    """``--out``, ``--resume`` and ``--quiet``, alike in every training command; ``kind`` names
    the default run directory, ``runs/KIND-<time>`` (:func:`default_run_dir`)."""
    parser.add_argument("--out", help=f"run directory (default runs/{kind}-<time>; with --resume "
                                      f"and no --out, the newest runs/{kind}-*)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--no-lock", action="store_true",
                        help="do not lock the run directory (for a file system without file "
                             "locks; then make sure no other run uses --out)")


def default_run_dir(kind: str, resume: bool) -> str:
    """A new ``runs/KIND-<time>``, or with ``resume`` the newest existing ``runs/KIND-*``."""
    if resume:
        existing = sorted(glob.glob(os.path.join("runs", f"{kind}-*")))
        if not existing:
            raise UsageError(f"--resume: no run directory runs/{kind}-* to resume; pass --out DIR")
        return existing[-1]
    return os.path.join("runs", f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}")


def run_in_directory(args: argparse.Namespace, kind: str, run: Callable[[], int]) -> int:
    """``run()`` holding the run directory ``args.out`` (default :func:`default_run_dir`) from
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
        return run()
    finally:
        if held is not None:
            held.close()


def check_resumable(args: argparse.Namespace, run_options: Sequence[str],
                    kind: str) -> checkpoint.Checkpoint | None:
    """Before anything is written to ``args.out``: its latest checkpoint, read back whole, or
    None for a new run. A run directory that holds checkpoints needs ``--resume``; the checkpoint
    must hold a model of ``kind`` (a kind of the registry, minitfm.models) and pass the check of
    :mod:`minitfm.usable` (parameters, dtypes, finite values, Adam's moments); the options that
    define the run (``run_options``, names of ``args``) must be those it was started with (its
    ``run.json``)."""
    latest = checkpoint.latest(args.out)
    if latest is None:
        return None
    if not args.resume:
        raise UsageError(f"{args.out} already holds checkpoints of a run: continue it with "
                         f"--resume, or choose another --out")
    ckpt = usable.load(latest, kind).ckpt       # the model is sound before anything is read
    try:
        started = json.loads(Path(args.out, train.RUN_INFO_NAME).read_text())["args"]
    except (OSError, ValueError, KeyError):
        return ckpt                              # no record: train() checks the checkpoint
    changed = [f"--{name.replace('_', '-')}: the run has {started[name]!r}, now "
               f"{getattr(args, name)!r}" for name in run_options
               if name in started and started[name] != getattr(args, name)]
    if changed:
        raise UsageError(f"cannot resume {args.out} with other options:\n  " + "\n  ".join(changed)
                         + "\nResume with the options it was started with, or start a new run "
                           "with another --out")
    return ckpt


def model_config(preset: str, vocab_size: int, args: argparse.Namespace) -> Config:
    """The preset's config for a joint vocabulary of ``vocab_size``, with the model options given
    on the command line (``--layers``, ``--d-model``, ``--d-ff``, ``--heads``, ``--max-len``,
    ``--dropout``, ``--attention-dropout``, ``--relu-dropout``, ``--label-smoothing``; absent or
    None: the preset's value)."""
    options = {"n_layers": "layers", "d_model": "d_model", "d_ff": "d_ff", "n_heads": "heads",
               "max_len": "max_len", "dropout": "dropout", "attention_dropout": "attention_dropout",
               "relu_dropout": "relu_dropout", "label_smoothing": "label_smoothing"}
    overrides = {field: getattr(args, option) for field, option in options.items()
                 if getattr(args, option, None) is not None}
    try:
        return Config.preset(preset, src_vocab=vocab_size, tgt_vocab=vocab_size, **overrides)
    except ValueError as exc:
        raise UsageError(f"model options: {exc}") from exc


def lr_schedule(kind: str, *, d_model: int, warmup: int, steps: int, lr: float,
                min_lr: float = 0.0):
    """The learning rate of each step for ``--schedule KIND``: ``paper``, equation (3) scaled by
    ``lr``; ``cosine`` or ``linear``, a warm-up to the peak ``lr`` then a decay to ``min_lr`` at
    step ``steps`` (optim.py)."""
    if kind == "paper":
        return optim.LRSchedule(d_model, warmup, lr)
    return optim.WarmupDecaySchedule(lr, warmup, steps, min_lr, kind)


def stopped(state: train.TrainState, out: str) -> int:
    """Say how to continue a run stopped by a signal; return its exit status, 128 + signal."""
    signum = state.stop_signal or signal.SIGINT
    how = stops.describe_signal(signum)
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
    (as a KeyboardInterrupt; a block under :func:`minitfm.stops.interrupts_deferred`, such as a
    save, finishes first), with one line (``interrupted``, ``stopped by SIGTERM``) and status
    128 + the signal's number; later signals are ignored while it ends. A training loop inside
    takes its signals itself (it saves a checkpoint), and so does any code that catches them.

    As one of several workers, ``run()`` returns on all of them together (done, or stopped by a
    signal they agreed on; see :mod:`minitfm.train`), and they finish together. An error or a
    signal in one worker, where the others may be waiting for it in a collective, ends every
    worker with this status (``World.fail_together``), after the message."""
    world = distributed.world()
    with world.fail_together(), stops.StopRequests() as requests:
        try:
            status = run()
        except KeyboardInterrupt:
            signum = requests.signum or signal.SIGINT
            print(stops.describe_signal(signum), file=sys.stderr, flush=True)
            return _failed(world, exits.for_signal(signum))
        except Exception as exc:
            status = exits.status_of(exc)
            if status is None:
                raise                   # not a user's error: a bug, shown with its traceback
            print(exits.message(exc, sizes), file=sys.stderr, flush=True)
            return _failed(world, status)
        world.finish()
        return status


def _failed(world: distributed.World, status: int) -> int:
    """``status``, or as one of several workers, the end of all of them with it."""
    if world.distributed:
        raise SystemExit(status)        # fail_together: MPI_Abort with this status
    return status
