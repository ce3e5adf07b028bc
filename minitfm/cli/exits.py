"""The exit statuses of every command, and which error gives which: one table, here.

====================  ==========================================================================
status                meaning
====================  ==========================================================================
0                     done
1                     a run-time failure: the input was fine, the run was not (a loss that ran
                      off, a file that could not be written: disk full, read-only file system,
                      no right to write there, I/O error; a file the disk failed to give back,
                      an I/O error while reading it: the file was not judged; out of memory, in
                      training or after it; a gradient check that failed)
2                     bad usage or bad input: an option, a file that is missing, unreadable,
                      empty, damaged, of another kind or in another encoding than UTF-8, a
                      symbolic link that leads nowhere (a loop, a missing target), a backend
                      or a C++ compiler this machine cannot run (or that does not work), a run
                      directory in use by another run or whose run files are not regular
                      files; nothing was changed
128 + N               stopped by signal N: 130 for Ctrl-C (SIGINT), 143 for SIGTERM, 129 for
                      SIGHUP; a training run saves a checkpoint first. 141 (SIGPIPE's): the
                      reader of standard output went away (``| head``), said by no message
====================  ==========================================================================

Every command (``train_toy.py``, ``train_lm.py``, ``train_wmt.py``, ``python -m minitfm.translate``,
``average``, ``plot``, ``gradcheck``, ``kernelcheck``, ``export``, ``learn``; ``launch`` refuses
with the same line and status) reports through :func:`minitfm.cli.reporting.report_errors`,
which prints one ``error:`` line (no traceback) and exits with :func:`status_of` the error. A new
error class lands in a row by subclassing one named here (a bad option: :class:`UsageError`).
argparse's own usage errors exit with 2 as well.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator

from minitfm import backend, files
from minitfm.backend import BackendError
from minitfm.checkpoint import CheckpointError
from minitfm.data import DataError
from minitfm.export.source import ExportError
from minitfm.workers.placement import PlacementError
from minitfm.plotting import PlotError
from minitfm.training.divergence import TrainingDiverged
from minitfm.training.plan import PlanError
from minitfm.training.rundir import (LockUnsupported, NotARunDirectory, RunDirectoryBusy,
                                     WriteFailed)
from minitfm.decoding.translation import TranslateError

__all__ = ["DONE", "FAILED", "BAD_INPUT", "UsageError", "OutOfMemoryAfterTraining",
           "BAD_INPUT_ERRORS", "FAILURES", "status_of", "for_signal", "message",
           "after_training"]

DONE = 0
FAILED = 1          # a run-time failure
BAD_INPUT = 2       # bad usage or bad input (argparse's status for a bad option, too)


class UsageError(Exception):
    """Options that do not fit together; the message says what to change. (Options that do
    not fit the run's data, found once it is read: ``minitfm.training.plan.PlanError``.)"""


class OutOfMemoryAfterTraining(MemoryError):
    """Memory ran out in what a training command does once training is done (the test set's
    decoding, the held-out examples, the samples): the message says that the training and its
    checkpoint are saved, and how to do the rest alone; ``sizes`` the options to lower there."""

    def __init__(self, message: str, sizes: str) -> None:
        super().__init__(message)
        self.sizes = sizes


@contextlib.contextmanager
def after_training(what: str, checkpoint: str | None, step: int, sizes: str,
                   alone: str) -> Iterator[None]:
    """Run ``what`` (in words: "the test set's evaluation") once a run has trained to ``step``
    and saved ``checkpoint``: memory that runs out there is :class:`OutOfMemoryAfterTraining`,
    which says so, ``alone`` (how to do it on its own) and ``sizes`` (what to lower)."""
    try:
        yield
    except MemoryError as exc:
        kept = (f"its checkpoint {checkpoint} (step {step}) is saved" if checkpoint
                else f"it reached step {step}")
        raise OutOfMemoryAfterTraining(
            f"{str(exc).rstrip('.') or 'no more memory'}, in {what} after training; the "
            f"training is done and {kept}: {alone}", sizes) from exc


# Checked in this order: the first row whose classes include the error's class gives the status.
FAILURES = (TrainingDiverged, WriteFailed, MemoryError)
BAD_INPUT_ERRORS = (
    UsageError, PlanError, DataError, CheckpointError, BackendError, PlacementError, ExportError,
    RunDirectoryBusy, LockUnsupported, NotARunDirectory, TranslateError, PlotError,
    # a path the user named that cannot be used as asked
    FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError, PermissionError,
    # a file whose text is not UTF-8, or whose JSON does not parse
    UnicodeDecodeError, json.JSONDecodeError,
)


def status_of(exc: BaseException) -> int | None:
    """The exit status for ``exc``; None for an error that is not in the table (a bug: it is
    shown with its traceback)."""
    if isinstance(exc, FAILURES):
        return FAILED
    if isinstance(exc, BAD_INPUT_ERRORS) or _link_trouble(exc) is not None:
        return BAD_INPUT
    if isinstance(exc, OSError):        # disk full, I/O error, file too large: the run failed
        return FAILED
    return None


def for_signal(signum: int) -> int:
    """128 + the signal's number: the shell's status for a process a signal ended."""
    return 128 + int(signum)


def message(exc: BaseException, sizes: str | None = None) -> str:
    """The one ``error:`` line for ``exc``; ``sizes``: the command's options that set how much
    memory it takes (``--max-tokens``), which a message that memory ran out names."""
    if isinstance(exc, MemoryError):
        sizes = getattr(exc, "sizes", None) or sizes
        return (f"error: out of memory on {backend.memory_in_words()}"
                f"{': ' + str(exc).rstrip('.') if str(exc) else ''}; lower "
                f"{sizes or 'the sizes the command was given'}, or use a device with more memory")
    trouble = _link_trouble(exc)
    if trouble is not None:
        fix = ("point it at the file meant, or give that file itself"
               if os.path.islink(exc.filename)
               else "mend the links on the way, or give another path")
        return f"error: {os.fsdecode(exc.filename)} is {trouble}: {fix}"
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        return f"error: {exc.filename}: {exc.strerror}"
    if isinstance(exc, OSError) and exc.strerror:   # the system did not say which file or stream
        return f"error: {exc.strerror} (the system did not say on which file or stream)"
    return f"error: {exc}"


def _link_trouble(exc: BaseException) -> str | None:
    """For an ``OSError`` on a file named in it that a symbolic link that leads nowhere caused (a
    loop of them: ELOOP; a link to nothing: ENOENT; either, for a folder to be made: EEXIST),
    what that link is, in words (``files.link_trouble``); else None."""
    if (not isinstance(exc, OSError)
            or exc.errno not in (errno.ELOOP, errno.ENOENT, errno.EEXIST)
            or not isinstance(exc.filename, (str, bytes, os.PathLike))):
        return None
    trouble = files.link_trouble(exc.filename)
    if trouble is None and exc.errno == errno.ELOOP:
        return "a path that passes through a loop of symbolic links"
    return trouble
