"""How every command's ``main()`` ends: its errors, the signals it gets, and standard output
that fails.

- an error prints one ``error:`` line and exits with the status of :mod:`minitfm.cli.exits`, the
  one table for every command (2 bad usage or input, 1 a run-time failure); a file that cannot
  be written names the file and the reason;
- Ctrl-C, SIGTERM or SIGHUP outside training ends the command at once with one line
  (``interrupted``, ``stopped by SIGTERM``) and 128 + the signal's number (130, 143, 129); a
  training run stopped by a signal exits with the same status after saving its checkpoint
  (:func:`minitfm.cli.runs.stopped`);
- started as several workers (``mpiexec -n N``), a signal to any of them stops all with that
  status, and an error or a Ctrl-C in one worker ends all of them (:func:`report_errors`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
from collections.abc import Callable

from minitfm.workers import distributed
from minitfm.cli import exits
from minitfm.training.stops import StopRequests, describe_signal, raise_if_lost

__all__ = ["EXIT_INTERRUPTED", "report_errors", "OutputFailed", "describe_stdout"]

EXIT_INTERRUPTED = exits.for_signal(signal.SIGINT)   # 130, the shell's code for Ctrl-C


def report_errors(run: Callable[[], int], sizes: str | None = None) -> int:
    """``run()``'s exit status; an error in the table of :mod:`minitfm.cli.exits` prints one
    ``error: ...`` line and gives its status there (2 bad usage or input, 1 a run-time failure);
    out of memory, it names the device, its memory and ``sizes``, the options to lower.

    Signals: while ``run()`` runs, SIGINT, SIGTERM and SIGHUP end it at once where they arrive
    (as a KeyboardInterrupt; a block under ``minitfm.training.stops.interrupts_deferred``, such
    as an update, finishes first, or stops at a point it names: a checkpoint being written, at
    its next write), with one line (``interrupted``, ``stopped by SIGTERM``) and status 128 +
    the signal's number; later signals are ignored while it ends, and for a few seconds after
    it has returned, while the process exits (``stops._Lingering``). A training loop inside
    takes its signals itself (it saves a checkpoint), and so does any code that catches them.

    As one of several workers, ``run()`` returns on all of them together (done, or stopped by a
    signal they agreed on; see :mod:`minitfm.training.loop`), and they finish together. An error
    or a signal in one worker, where the others may be waiting for it in a collective, ends
    every worker with this status (``World.fail_together``), after the message."""
    world = distributed.world()
    # the signals taken last, just before the block that turns them into a status (a signal
    # while standard output was being guarded ended the command with a traceback)
    with world.fail_together(), _guarded_stdout(), StopRequests(linger=True) as requests:
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
