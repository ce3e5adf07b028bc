"""A training worker that outlives its MPI launcher: closing the terminal of ``mpiexec`` loses
nothing.

Why. ``mpiexec`` (MPICH's Hydra) passes Ctrl-C, SIGTERM, SIGUSR1 and SIGUSR2 on to the workers,
but not SIGHUP. Closing the terminal or the SSH session of ``mpiexec -n 2 python train_wmt.py``
sends SIGHUP to the launcher's process group, which holds the launcher alone (each worker runs in
a session of its own); the launcher dies of it, and its proxies then end every worker with
SIGKILL, which no handler can catch. The other ways out do not work: a worker cannot put a
handler into the launcher's process group (a process group belongs to one session, and a process
cannot join another session's), and ``nohup``/``setsid`` keep the launcher alive but leave the
workers unaware. So the process the launcher starts does not do the work itself.

How. :func:`run`, around a trainer's ``main``, makes the process the launcher started a
*keeper*: it starts the same command again as its child, the *worker*, in a session of its own
(out of reach of the kill of the keeper's process group), hands it the launcher's connection
(``PMI_FD``, then closed here, so that the launcher still sees a worker that dies), forwards to
it every signal the launcher passes on, waits, and exits with its status (a worker killed by a
signal: killed by the same one, after a line naming the worker). The worker:

- writes straight to the launcher's standard output and error where the launcher runs on this
  machine (reopened from ``/proc/PID/fd``; a file only once the launcher is gone, as the launcher
  writes to it at an offset of its own), not through the proxy's pipes that end with the
  launcher, so that the run's last lines reach the terminal or file they always went to (a
  terminal that has hung up is swapped for ``/dev/null``; ``mpiexec``'s options that label or
  split each rank's output then see only what comes through the keeper);
- watches its keeper. When the keeper is gone and the launcher still runs, the launcher is
  ending a job that failed (a worker was killed): this worker ends at once, as before. When the
  launcher is gone too, it is a hang-up: the worker sends itself SIGHUP, and the run stops as on
  any SIGHUP (every worker after the same update, rank 0 saves a checkpoint and says how to
  ``--resume``, status 129; :mod:`minitfm.stops`). To tell the two apart, the worker holds the
  proxy's pipe open until it has looked: the proxy, and so the launcher, wait for its end;
- ends by itself if it still runs ``GRACE`` seconds after its keeper (a worker on another
  machine died, and the others would wait for it forever).

Only under a launcher (:func:`minitfm.distributed.launcher_size`), on POSIX; elsewhere
:func:`run` just calls ``main``. Host-only code.
"""

from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable

from minitfm import distributed

__all__ = ["KEEPER_VARIABLE", "GRACE", "LAUNCHERS", "run"]

KEEPER_VARIABLE = "MINITFM_KEEPER"     # set in the worker: the keeper's pid
GRACE = 300.0                          # seconds a worker may take to stop once its keeper is gone
LAUNCHERS = ("mpiexec", "mpirun", "prterun", "orterun", "srun")   # names of launcher processes
_FORWARDED = tuple(getattr(signal, name) for name in
                   ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2")
                   if hasattr(signal, name))


def run(main: Callable[[], int]) -> int:
    """``main()``'s exit status, as a worker that outlives its launcher.

    Under an MPI launcher, the process it started becomes the keeper of a worker that runs this
    same command (it never returns), and in that worker ``main()`` runs watched. A worker whose
    launcher has ended leaves at once when ``main()`` is done, without MPI's finalisation (which
    needs the launcher). Without a launcher: ``main()``."""
    keeper = os.environ.get(KEEPER_VARIABLE)
    if keeper is None or not keeper.isdigit():
        if os.name == "posix" and distributed.launcher_size() is not None:
            _keep()
        return main()
    _watch(int(keeper))
    try:
        status = main()
    except SystemExit as exc:
        if not _keeper_gone.is_set():
            raise
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:
        if not _keeper_gone.is_set():
            raise
        traceback.print_exc()
        status = 1
    if _keeper_gone.is_set():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


# ---- the keeper ------------------------------------------------------------------------------

def _keep() -> None:
    pending: list[int] = []
    worker: subprocess.Popen | None = None

    def forward(signum, frame):
        if worker is None:
            pending.append(signum)
            return
        try:
            worker.send_signal(signum)
        except ProcessLookupError:
            pass

    for signum in _FORWARDED:
        signal.signal(signum, forward)
    sys.stdout.flush()
    sys.stderr.flush()
    connection = os.environ.get("PMI_FD", "")
    connection = (int(connection),) if connection.isdigit() else ()
    worker = subprocess.Popen([sys.executable, *sys.orig_argv[1:]], pass_fds=connection,
                              start_new_session=True,
                              env={**os.environ, KEEPER_VARIABLE: str(os.getpid())})
    for fd in connection:       # the worker's now: when it ends, the launcher knows
        os.close(fd)
    for signum in pending:
        forward(signum, None)
    status = worker.wait()
    if status >= 0:
        os._exit(status)
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = f"signal {-status}"
    print(f"worker pid {worker.pid} (kept by pid {os.getpid()}) was killed by {name}",
          file=sys.stderr, flush=True)
    if -status != signal.SIGKILL:
        signal.signal(-status, signal.SIG_DFL)
    os.kill(os.getpid(), -status)              # the launcher sees the worker's end as it was
    os._exit(128 - status)


# ---- the worker ------------------------------------------------------------------------------

def _watch(keeper: int) -> None:
    """Write to the launcher's terminal or pipe directly from now on (to its file only once it
    is gone: it writes there at an offset of its own), and watch the keeper."""
    launcher = _launcher(keeper)
    later = _outputs_of(launcher) if launcher else {}
    held = os.dup(1)        # the proxy's pipe: the proxy, and so the launcher, wait for its end
    direct = set()
    for fd, replacement in list(later.items()):
        if not stat.S_ISREG(os.fstat(replacement).st_mode):
            os.dup2(replacement, fd)
            os.close(later.pop(fd))
            direct.add(fd)
    threading.Thread(target=_when_keeper_is_gone, args=(keeper, launcher, held, direct, later),
                     daemon=True, name="keeper watch").start()


_keeper_gone = threading.Event()


def _when_keeper_is_gone(keeper: int, launcher: int | None, held: int, direct: set[int],
                         later: dict[int, int]) -> None:
    _wait_for_end(keeper)
    _keeper_gone.set()
    failed = launcher is not None and _running(launcher)    # it is ending a job that failed
    for fd in (1, 2):           # never the proxy's pipes, which have no reader now
        if fd in later and not failed:
            os.dup2(later[fd], fd)          # the launcher has ended: its file is this one's
        elif fd not in direct or _hung_up(fd):
            _silence(fd)
    os.close(held)
    if failed:
        print(f"the launcher is ending this job: ending worker pid {os.getpid()} too",
              file=sys.stderr, flush=True)
        os._exit(1)
    os.kill(os.getpid(), signal.SIGHUP)         # stop as on a closed terminal
    time.sleep(GRACE)
    print(f"worker pid {os.getpid()} did not stop within {GRACE:.0f} s of its launcher's end "
          f"(another worker is gone): ending it", file=sys.stderr, flush=True)
    os._exit(128 + signal.SIGHUP)


def _wait_for_end(pid: int) -> None:
    """Until process ``pid`` (this process's parent) has ended."""
    try:
        handle = os.pidfd_open(pid)
    except (AttributeError, OSError):
        handle = None
    if handle is None or os.getppid() != pid:
        while os.getppid() == pid:
            time.sleep(0.1)
        return
    try:
        select.select([handle], [], [])         # readable once the process has ended
    finally:
        os.close(handle)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _launcher(keeper: int) -> int | None:
    """The pid of the launcher: the nearest ancestor of the keeper with a name of LAUNCHERS,
    on this machine; None where there is none (or no /proc to tell)."""
    pid = keeper
    for _ in range(8):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                name, _, rest = f.read().partition(b" (")[2].rpartition(b")")
        except OSError:
            return None
        if name.decode(errors="replace").startswith(LAUNCHERS):
            return pid
        pid = int(rest.split()[1])
        if pid <= 1:
            return None
    return None


def _outputs_of(launcher: int) -> dict[int, int]:
    """The launcher's standard output and error, opened anew for this process: ``{1: fd,
    2: fd}``, those that can be."""
    outputs = {}
    for fd in (1, 2):
        try:        # not blocking on a pipe without a reader; appending to a file
            opened = os.open(f"/proc/{launcher}/fd/{fd}",
                             os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
        except OSError:
            continue
        os.set_blocking(opened, True)
        outputs[fd] = opened
    return outputs


def _hung_up(fd: int) -> bool:
    """Whether ``fd`` is a terminal that has hung up: a character device no longer a tty (or
    /dev/null, which is as good as one)."""
    try:
        return stat.S_ISCHR(os.fstat(fd).st_mode) and not os.isatty(fd)
    except OSError:
        return True


def _silence(fd: int) -> None:
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)
