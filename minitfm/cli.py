"""What the command lines share: the run directory, the model config from options, option
validation, the backend choice, each worker's placement (its GPU or its BLAS threads,
``--threads``) and the way ``main()`` reports errors and signals.

``train_toy.py``, ``train_wmt.py`` and ``python -m minitfm.translate / average / plot`` are thin
front ends over the library; the glue they have in common lives here once, so that all behave
alike:

- every numeric option is checked by argparse with a ``type=`` from here (:func:`integer`,
  :func:`number`): a bad value is a usage error naming the option and its allowed range, before
  any work; NaN and infinity are refused wherever a finite number is meant;
- a user error prints one ``error:`` line and exits with the command's error status; a file that
  cannot be written names the file and the reason;
- Ctrl-C outside training prints ``interrupted`` and exits with 130, the shell's code for it;
  a training run stopped by a signal exits with 128 + the signal's number (SIGINT 130,
  SIGTERM 143, SIGHUP 129) after saving its checkpoint;
- started as several workers (``mpiexec -n N``), a signal to any of them stops all with that
  status, and an error or a Ctrl-C in one worker ends all of them (:func:`report_errors`).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from minitfm import backend, checkpoint, distributed, optim, placement, stops, train
from minitfm.data import DataError
from minitfm.models.translator import Config

__all__ = ["EXIT_INTERRUPTED", "UsageError", "USER_ERRORS", "integer", "number", "positive_int",
           "reuse_freed_memory", "add_backend_option", "select_backend", "add_threads_option",
           "place", "add_run_options", "add_optimiser_options", "add_schedule_options",
           "add_checkpoint_options", "add_logging_options", "add_seed_option",
           "add_placement_options",
           "default_run_dir", "check_resumable", "model_config", "stopped", "report_errors"]

EXIT_INTERRUPTED = 130   # the shell's code for a process stopped by Ctrl-C


class UsageError(Exception):
    """Options that do not fit together; the message says what to change."""


# what a user can cause: reported as one line, without a traceback
USER_ERRORS = (UsageError, DataError, checkpoint.CheckpointError, backend.BackendError,
               placement.PlacementError, train.TrainingDiverged, train.WriteFailed,
               FileExistsError, FileNotFoundError)


# ---- option values ---------------------------------------------------------------------------

def _bounds(low, high, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high:g}"
    return ""


def integer(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=`` for an integer in [low, high] (None: unbounded)."""
    def parse(text: str) -> int:
        wanted = " ".join(filter(None, ("an integer", _bounds(low, high, False, False))))
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value
    return parse


positive_int = integer(1)


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type=`` for a finite number in the given range; NaN and infinity are
    refused. ``low_open`` / ``high_open`` exclude the bound itself."""
    def parse(text: str) -> float:
        wanted = " ".join(filter(None, ("a finite number",
                                         _bounds(low, high, low_open, high_open))))
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}") from None
        if (not math.isfinite(value)
                or (low is not None and (value < low or (low_open and value == low)))
                or (high is not None and (value > high or (high_open and value == high)))):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
        return value
    return parse


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


def place(threads: int | None, cap: int | None, announce: bool = True) -> placement.Placement:
    """Place this worker (placement.place: its GPU, or its BLAS threads, from ``--threads``, the
    environment or its share of the cores, at most ``cap``) for the active backend, and print
    the decision as the run's first line (rank 0; not with ``announce=False``, for output that
    must be the command's text alone). Call it after the backend is chosen and before any array
    is made."""
    world = distributed.world()
    decided = placement.place(world, backend.name, threads=threads, cap=cap)
    if announce and world.is_root:
        print(decided.describe(), flush=True)
    return decided


# ---- option groups shared by the training commands ------------------------------------------
# Each command passes its own defaults: a value (None: filled in later, from a preset or a task)
# and the words its help shows for it, such as "default 10" or "default: preset".

def add_optimiser_options(group, *, warmup: str, warmup_type=positive_int,
                          lr_factor: tuple[float | None, str] | None = None,
                          weight_decay: str | None = None) -> None:
    """``--warmup``, ``--clip-norm``; ``--lr-factor`` (``(default, words)``) and
    ``--weight-decay`` where the command has them."""
    group.add_argument("--warmup", type=warmup_type, help=f"warmup steps ({warmup})")
    if lr_factor is not None:
        group.add_argument("--lr-factor", type=number(0, low_open=True), default=lr_factor[0],
                           help=f"scales the paper's learning-rate schedule "
                                f"({lr_factor[1]})")
    if weight_decay is not None:
        group.add_argument("--weight-decay", type=number(0),
                           help=f"AdamW's decoupled decay ({weight_decay})")
    group.add_argument("--clip-norm", type=number(0, low_open=True),
                       help="clip the gradient norm (default: no)")


def add_schedule_options(group, *, choices: Sequence[str], default: str, lr_help: str,
                         min_lr: tuple[float | None, str], steps: str,
                         cooldown: bool = False) -> None:
    """``--schedule``, ``--lr``, ``--min-lr`` (``(default, words)``) and where the command has it
    ``--cooldown``; ``steps``: the option that ends the run (``--max-steps``, ``--steps``)."""
    group.add_argument("--schedule", choices=tuple(choices),
                       help=f"after the warmup: the paper's inverse square root, or a linear or "
                            f"cosine decay to --min-lr at {steps}, or at --time-limit if that "
                            f"comes first ({default})")
    group.add_argument("--lr", type=number(0, low_open=True), help=lr_help)
    group.add_argument("--min-lr", type=number(0), default=min_lr[0],
                       help=f"rate at {steps} with --schedule linear or cosine "
                            f"({min_lr[1]})")
    if cooldown:
        group.add_argument("--cooldown", type=number(0, 1, low_open=True), metavar="FRACTION",
                           help=f"bring the rate down linearly to 0 over this last part of the "
                                f"run (of {steps}, or of --time-limit if that comes first)")


def add_checkpoint_options(group, *, save_every: tuple[int | None, str],
                           keep_last: bool = False) -> None:
    """``--save-every`` (``(default, words)``) and where the command has it ``--keep-last``."""
    group.add_argument("--save-every", type=integer(0), default=save_every[0],
                       help=f"steps between checkpoints ({save_every[1]})")
    if keep_last:
        group.add_argument("--keep-last", type=positive_int, default=5,
                           help="checkpoints kept (default 5)")


def add_logging_options(group, *, valid_every: tuple[int | None, str],
                        valid_option: str = "--valid-every", log_every: bool = False) -> None:
    """``--valid-every`` (or the command's ``valid_option``; ``(default, words)``) and where the
    command has it ``--log-every``."""
    if log_every:
        group.add_argument("--log-every", type=positive_int, default=10,
                           help="steps between log lines (default 10)")
    group.add_argument(valid_option, type=integer(0), default=valid_every[0],
                       help=f"steps between validations ({valid_every[1]})")


def add_seed_option(group, what: str = "") -> None:
    group.add_argument("--seed", type=integer(0), default=0,
                       help=f"seeds {what or 'initialisation, dropout and the data'} (default 0)")


def add_placement_options(group, backend_default: str, threads_cap: int | None) -> None:
    """``--backend`` and ``--threads``: where a worker runs (:func:`place`)."""
    add_backend_option(group, backend_default)
    add_threads_option(group, threads_cap)


# ---- the run directory -----------------------------------------------------------------------

def add_run_options(parser, kind: str) -> None:
    """``--out``, ``--resume`` and ``--quiet``, alike in every training command; ``kind`` names
    the default run directory, ``runs/KIND-<time>`` (:func:`default_run_dir`)."""
    parser.add_argument("--out", help=f"run directory (default runs/{kind}-<time>; with --resume "
                                      f"and no --out, the newest runs/{kind}-*)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def default_run_dir(kind: str, resume: bool) -> str:
    """A new ``runs/KIND-<time>``, or with ``resume`` the newest existing ``runs/KIND-*``."""
    if resume:
        existing = sorted(glob.glob(os.path.join("runs", f"{kind}-*")))
        if not existing:
            raise UsageError(f"--resume: no run directory runs/{kind}-* to resume; pass --out DIR")
        return existing[-1]
    return os.path.join("runs", f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}")


def check_resumable(args: argparse.Namespace, run_options: Sequence[str],
                    kind: str) -> checkpoint.Checkpoint | None:
    """Before anything is written to ``args.out``: its latest checkpoint, read back whole, or
    None for a new run. A run directory that holds checkpoints needs ``--resume``; the checkpoint
    must hold a model of ``kind`` (a kind of the registry, minitfm.models); the options that
    define the run (``run_options``, names of ``args``) must be those it was started with (its
    ``run.json``)."""
    latest = checkpoint.latest(args.out)
    if latest is None:
        return None
    if not args.resume:
        raise UsageError(f"{args.out} already holds checkpoints of a run: continue it with "
                         f"--resume, or choose another --out")
    ckpt = checkpoint.load(latest)
    checkpoint.check_kind(ckpt, kind)
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


def report_errors(run: Callable[[], int], exit_error: int) -> int:
    """``run()``'s exit status; a user error prints ``error: ...`` and gives ``exit_error``.

    As one of several workers, ``run()`` returns on all of them together (done, or stopped by a
    signal they agreed on; see :mod:`minitfm.train`), and they finish together. An error or a
    Ctrl-C in one worker, where the others may be waiting for it in a collective, ends every
    worker with this status (``World.fail_together``), after the message."""
    world = distributed.world()
    with world.fail_together():
        try:
            status = run()
        except USER_ERRORS as exc:
            print(f"error: {exc}", file=sys.stderr)
            return _failed(world, exit_error)
        except OSError as exc:          # a file the command could not read or write
            print(f"error: {exc.filename or 'a file'}: {exc.strerror or exc}", file=sys.stderr)
            return _failed(world, exit_error)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return _failed(world, EXIT_INTERRUPTED)
        world.finish()
        return status


def _failed(world: distributed.World, status: int) -> int:
    """``status``, or as one of several workers, the end of all of them with it."""
    if world.distributed:
        raise SystemExit(status)        # fail_together: MPI_Abort with this status
    return status
