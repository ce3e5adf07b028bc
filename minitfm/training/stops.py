"""Stopping a training run on a signal, never in the middle of an update or a save.

Ctrl-C (SIGINT), SIGTERM (``kill``, ``docker stop``, batch schedulers) and SIGHUP all stop
training the same way. While :class:`StopRequests` is active (``with StopRequests() as stops:``
around the loop), the first signal is raised as a ``KeyboardInterrupt`` where it arrives, or, inside
a block that must not be cut (``stops.held()``, or :func:`interrupts_deferred` from anywhere),
at the end of that block, or at a point the block names as safe to stop at (:func:`stop_point`,
in a block held with ``stop_points``: a file written through code that a signal must not cut,
such as zipfile's). Once stopping, further signals are counted and ignored, so that a second
Ctrl-C cannot cut the final save short. A command's own StopRequests (``linger``) keeps ignoring
them for a while after it ends for one (:class:`_Lingering`): the process is ending, and an
impatient repeat that lands while it returns and shuts down must not kill it by the signal, with
no status of its own and a traceback.

Under ``python -m minitfm.launch`` (:mod:`minitfm.cli.launch`), SIGUSR1 stands for SIGHUP, which
``mpiexec`` does not pass on: it is taken, and reported, as SIGHUP.

Workers of a distributed run never raise where a signal arrives (``always_held``): at the end of
every update they gather every worker's signal (:func:`stop_if_any_worker_asks`), and when any
worker received one, all raise :class:`AgreedStop` there, together.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from collections.abc import Mapping

from minitfm.workers import distributed

__all__ = ["STOP_SIGNALS", "StopRequests", "AgreedStop", "interrupts_deferred", "stop_point",
           "stop_if_any_worker_asks", "describe_signal", "raise_if_lost", "HANGUP_VARIABLE",
           "hangup_signal"]

STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP")
                     if hasattr(signal, name))

# Set by ``python -m minitfm.launch`` in the workers' environment: the name of the signal that
# stands for SIGHUP (the launcher's terminal closed), since mpiexec does not pass SIGHUP on.
HANGUP_VARIABLE = "MINITFM_HANGUP_SIGNAL"


def hangup_signal(environ: Mapping[str, str] = os.environ) -> int | None:
    """The signal that stands for SIGHUP in this worker (:data:`HANGUP_VARIABLE`), if any."""
    name = environ.get(HANGUP_VARIABLE, "")
    return getattr(signal, name, None) if name in ("SIGUSR1", "SIGUSR2") else None


class StopRequests:
    """SIGINT, SIGTERM and SIGHUP while training: the first one stops the run, raised as a
    KeyboardInterrupt where it arrives, or held back to the end of a block that must not be cut
    (:meth:`held`: an update, a save). Later ones are counted and ignored: the run is stopping
    already, and they must not cut its final save short.

    ``always_held``: a signal is only recorded, never raised (the workers of a distributed run
    agree on stopping at update boundaries; see :func:`stop_if_any_worker_asks`).

    Used as a context manager it installs its handlers (from the main thread only) and is the
    active one that :func:`interrupts_deferred` holds; leaving it restores both."""

    def __init__(self, always_held: bool = False, linger: bool = False) -> None:
        self.signum: int | None = None
        self._linger = linger
        self.ignored = 0
        self._holding = 1 if always_held else 0
        self._stop_points = False    # the one hold of the moment lets stop_point() raise
        self._raised = False
        self._stopping = False
        self._previous: dict = {}
        self._outer: StopRequests | None = None

    def __enter__(self) -> StopRequests:
        global _active
        if threading.current_thread() is threading.main_thread():
            hangup = hangup_signal()
            for signum in STOP_SIGNALS + ((hangup,) if hangup else ()):
                self._previous[signum] = signal.signal(signum, self._receive)
        self._outer, _active = _active, self
        return self

    def __exit__(self, *exc_info) -> None:
        global _active
        _active = self._outer
        ended = self._linger and self.signum is not None
        for signum, previous in self._previous.items():
            signal.signal(signum, _Lingering(previous) if ended else previous)
            if ended:
                _ignored_at_exit.add(signum)
        self._previous = {}

    def _receive(self, signum, frame) -> None:
        if self.signum is not None:
            self.ignored += 1
            return
        self.signum = signal.SIGHUP if signum == hangup_signal() else signum
        if not self._holding:
            self._raised = True
            raise KeyboardInterrupt

    def stopping(self) -> None:
        """From now on every signal is ignored, here and by the StopRequests this one is inside
        (the run is stopping: a signal that comes late, while it saves and says so, or to one
        worker after all agreed to stop, must not cut that short)."""
        requests = self
        while requests is not None:
            if requests.signum is None:
                requests.signum = self.signum or signal.SIGINT
            requests._raised = requests._stopping = True
            requests = requests._outer

    def raise_if_lost(self) -> None:
        """Raise the stop again if its KeyboardInterrupt was raised and lost. Raised where the
        signal arrives, it can pass through code that swallows it: a library's compiled module,
        run on its first import, that clears the errors of what it calls (NumPy's random
        generators, imported on a first draw, did so about once in a hundred samplings under
        load), and the command would run on to its end. So the places where work goes on
        call this: each write to standard output, each update's end, each checkpoint averaged."""
        if self._raised and not self._stopping and not self._holding:
            raise KeyboardInterrupt

    @contextlib.contextmanager
    def held(self, stop_points: bool = False):
        """Hold the signals back to the end of the block, then raise the first as a
        KeyboardInterrupt. ``stop_points``: the block may stop sooner, at the points it names
        with :meth:`stop_point`, unless a block further out holds the signals too."""
        opens = stop_points and not self._holding
        self._holding += 1
        self._stop_points = self._stop_points or opens
        try:
            yield
        finally:
            self._holding -= 1
            self._stop_points = self._stop_points and not opens
        if self.signum is not None and not self._raised and not self._holding:
            self._raised = True
            raise KeyboardInterrupt

    def stop_point(self) -> None:
        """A point of a block held with ``stop_points`` where stopping cuts nothing in half (a
        file about to be written, whose writer copes with a write that fails): a signal held
        back raises KeyboardInterrupt here, once, so a long write stops at once. Nothing is
        raised where a block further out holds the signals (a training run's save is never cut
        short), nor where they are only recorded (``always_held``)."""
        if self._stop_points and self._holding == 1 and self.signum is not None \
                and not self._raised:
            self._raised = True
            raise KeyboardInterrupt


_active: StopRequests | None = None    # the innermost StopRequests entered, if any


class _Lingering:
    """A stop signal's handler once a command has ended for a signal: for ``LINGER`` seconds
    the signal is ignored (the process is returning and shutting down: the status is decided),
    then it does what ``previous``, the handler before the command, did. Python puts the default
    handlers back as it finalizes, but leaves one that ignores: the signals it has been are
    ignored from the process's exit on (:func:`_ignore_at_exit`)."""

    LINGER = 5.0

    def __init__(self, previous) -> None:
        self.previous, self.until = previous, time.monotonic() + self.LINGER

    def __call__(self, signum, frame) -> None:
        if time.monotonic() < self.until or self.previous in (signal.SIG_IGN, None):
            return
        if callable(self.previous):
            self.previous(signum, frame)
            return
        signal.signal(signum, self.previous)         # SIG_DFL: as if it had been there
        signal.raise_signal(signum)


_ignored_at_exit: set[int] = set()     # stop signals of a command that ended for one


@atexit.register
def _ignore_at_exit() -> None:
    """As the process exits after a command ended for a signal, that signal ignored to the end
    (an impatient repeat while the interpreter shuts down would kill it by the signal)."""
    for signum in _ignored_at_exit:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def interrupts_deferred(stop_points: bool = False):
    """Hold back Ctrl-C (and SIGTERM, SIGHUP) until the block is done, so an update or a save is
    never cut in half; the held-back signal then raises KeyboardInterrupt. ``stop_points``: or
    sooner, at the block's next :func:`stop_point`, unless a block further out holds it too."""
    if _active is not None:
        with _active.held(stop_points):
            yield
        return
    with StopRequests() as stops, stops.held(stop_points):
        yield


def stop_point() -> None:
    """:meth:`StopRequests.stop_point` of the innermost StopRequests entered, if any."""
    if _active is not None:
        _active.stop_point()


def raise_if_lost() -> None:
    """:meth:`StopRequests.raise_if_lost` of the innermost StopRequests entered, if any."""
    if _active is not None:
        _active.raise_if_lost()


class AgreedStop(KeyboardInterrupt):
    """Every worker stops at this update boundary; ``requests``: ``{rank: signal}``."""

    def __init__(self, requests: dict[int, int]) -> None:
        super().__init__(distributed.describe_stops(requests))
        self.requests = requests


def stop_if_any_worker_asks(world: distributed.World, stops: StopRequests) -> None:
    """At the end of an update, its validation and save: gather every worker's signal, if any.
    When some worker received one, all raise :class:`AgreedStop` here, together, each taking
    the signal of the first worker that asked unless it received one itself."""
    requests = world.stop_requests(stops.signum or 0)
    if requests:
        if stops.signum is None:
            stops.signum = requests[min(requests)]
        raise AgreedStop(requests)


def describe_signal(signum: int) -> str:
    """"interrupted" for SIGINT, else "stopped by SIGTERM" (or the signal's name)."""
    return ("interrupted" if signum == signal.SIGINT
            else f"stopped by {signal.Signals(signum).name}")
