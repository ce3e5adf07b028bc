"""``python -m minitfm.launch -n 2 python train_wmt.py ...``: ``mpiexec``, with a closed
terminal that stops the run with a checkpoint.

Why. MPICH's launcher passes Ctrl-C, SIGTERM, SIGUSR1 and SIGUSR2 on to its workers, but not
SIGHUP. Closing the terminal (or the SSH session) of ``mpiexec -n 2 python train_wmt.py ...``
sends SIGHUP to the launcher's process group; the launcher dies of it, and its proxies then end
every worker with SIGTERM and SIGKILL at once, before any worker could save. No worker can take
the signal in the launcher's place: each runs in a session of its own, and a process cannot
join another session's process group.

How. This command starts ``mpiexec`` with exactly the arguments it is given, in a session of its
own, where no terminal reaches it, and stays in the terminal's reach in its place:

- Ctrl-C, SIGTERM, SIGUSR1 and SIGUSR2 are passed to ``mpiexec`` as they come (and so to every
  worker);
- SIGHUP is passed as SIGUSR1, which ``mpiexec`` passes to every worker. A worker started this
  way (:data:`minitfm.training.stops.HANGUP_VARIABLE` in its environment) takes SIGUSR1 for the
  hang-up it stands for (:mod:`minitfm.training.stops`): all workers stop after the same update,
  rank 0 saves a checkpoint and prints the ``--resume`` line, and every worker exits with 129,
  as one training process does on SIGHUP;
- ``mpiexec``'s output passes through this process, which writes it on while it can and drops
  it once the terminal is gone: ``mpiexec`` itself never writes to a closed terminal (MPICH's
  launcher gives up, and ends the workers, when a write to its output fails).

The exit status is ``mpiexec``'s (129 after a hang-up). Host-only code, on POSIX; elsewhere the
command just runs ``mpiexec``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from minitfm import exits
from minitfm.exits import UsageError
from minitfm.training.stops import HANGUP_VARIABLE

__all__ = ["main", "find_mpiexec"]

_PASSED_ON = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2")
                   if hasattr(signal, name))
USAGE = """usage: python -m minitfm.launch MPIEXEC_ARGUMENTS...

Runs mpiexec with these arguments, e.g. `python -m minitfm.launch -n 2 python train_wmt.py
--out runs/wmt ...`, so that closing the terminal stops the training with a checkpoint
(status 129) instead of killing its workers unsaved. Ctrl-C and SIGTERM stop it as they stop
mpiexec."""


def find_mpiexec() -> str:
    """The ``mpiexec`` beside this Python (the ``[mpi]`` extra installs MPICH's there), else the
    one on ``PATH``."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise UsageError('no mpiexec found beside this Python or on PATH; install one with '
                         'pip install -e ".[mpi]" (MPICH), or use your cluster\'s MPI')
    return found


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return exits.DONE
    if not argv:
        print(f"{USAGE}\n\nerror: no command to launch: give mpiexec's arguments, e.g. "
              "-n 2 python train_wmt.py ...", file=sys.stderr)
        return exits.BAD_INPUT
    try:
        mpiexec = find_mpiexec()
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exits.BAD_INPUT
    if os.name != "posix":
        return subprocess.call([mpiexec, *argv])
    return _launch([mpiexec, *argv])


def _launch(command: list[str]) -> int:
    env = {**os.environ, HANGUP_VARIABLE: "SIGUSR1"}
    # A terminal stays with this process: mpiexec would forward what it reads to rank 0, and
    # fail once it is closed.
    stdin = subprocess.DEVNULL if sys.stdin is None or sys.stdin.isatty() else None
    launcher: subprocess.Popen | None = None
    pending: list[int] = []            # signals that came before mpiexec had started
    hung_up = False

    def pass_on(signum, frame):
        nonlocal hung_up
        if signum == signal.SIGHUP:
            if hung_up:
                return
            hung_up, signum = True, signal.SIGUSR1
        if launcher is None:
            pending.append(signum)
            return
        try:
            os.kill(launcher.pid, signum)
        except ProcessLookupError:
            pass

    for signum in (*_PASSED_ON, signal.SIGHUP):
        signal.signal(signum, pass_on)
    sys.stdout.flush()
    sys.stderr.flush()
    launcher = subprocess.Popen(command, stdin=stdin, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, start_new_session=True)
    for signum in pending:
        os.kill(launcher.pid, signum)
    relays = [threading.Thread(target=_relay, args=(pipe.fileno(), target.fileno()), daemon=True)
              for pipe, target in ((launcher.stdout, sys.stdout), (launcher.stderr, sys.stderr))]
    for relay in relays:
        relay.start()
    status = launcher.wait()
    for relay in relays:
        relay.join(timeout=10)   # a proxy left behind may hold the pipes: do not wait for it
    return status if status >= 0 else 128 - status


def _relay(source: int, target: int) -> None:
    """Copy ``source`` to ``target`` until its end; once ``target`` cannot be written (a closed
    terminal), go on reading and drop what comes."""
    writable = True
    while data := os.read(source, 65536):
        while writable and data:
            try:
                data = data[os.write(target, data):]
            except OSError:
                writable = False


if __name__ == "__main__":
    sys.exit(main())
