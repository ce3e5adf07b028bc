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

Counts. The number of workers (``-n`` / ``-np``, one per program of an ``mpiexec A : B`` line) is
checked before anything starts (:func:`check_counts`): a count that is not a whole number of 1 or
more is refused. Where every worker runs on this machine (no host list: no ``-f``, ``-hosts``,
``-configfile``, ``-rmk``, and no batch system's allocation in the environment, which MPICH reads
by itself), more workers than the cores this process may use take turns on them, which is slower
than one per core: that is said in one warning and run. More than :data:`MAX_WORKERS_PER_CORE`
per core is refused, as is a count for which ``mpiexec``'s process manager would need more open
files than this process may have (it keeps :data:`FILES_PER_WORKER` per worker: ends of its pipes
and its connection; MPICH ends such a run with a "Too many open files" error).

The exit status is ``mpiexec``'s (129 after a hang-up). Host-only code, on POSIX; elsewhere the
command just runs ``mpiexec``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

from minitfm.workers import placement
from minitfm.cli import exits
from minitfm.cli.exits import UsageError
from minitfm.training.stops import HANGUP_VARIABLE

__all__ = ["main", "find_mpiexec", "check_counts", "MAX_WORKERS_PER_CORE", "FILES_PER_WORKER",
           "LAUNCHER_FILES", "HOST_VARIABLES"]

_PASSED_ON = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2")
                   if hasattr(signal, name))
# Beyond this many workers a core, each gets a sliver of it and MPI's waits spin on the cores the
# others need: a run many times slower than one worker per core, not a larger one.
MAX_WORKERS_PER_CORE = 4
# Open files MPICH's process manager keeps per worker (the ends of its standard input, output and
# error pipes, and its PMI connection), and a margin for its own: measured, a run of -n N fails
# with "Too many open files" once 4 N + about 16 exceeds the limit.
FILES_PER_WORKER = 4
LAUNCHER_FILES = 32
# mpiexec's options (MPICH's Hydra, `mpiexec -h`) followed by one value, or by two; every other
# option stands alone. The first word that is neither begins the program and its arguments.
_ONE_VALUE = frozenset("""n np f hosts host hostfile machinefile rankmap wdir configfile genvlist
    envlist launcher launcher-exec rmk topolib bind-to binding map-by membind demux
    errfile-pattern outfile-pattern prepend-pattern gpus-per-proc iface localhost nameserver
    order-nodes ppn usize memory-alloc-kinds""".split())
_TWO_VALUES = frozenset({"genv", "env"})
_COUNTS = frozenset({"n", "np"})
# the options, and the batch systems' variables, that place workers on other machines
_HOSTS = frozenset({"f", "hosts", "host", "hostfile", "machinefile", "configfile", "rmk"})
HOST_VARIABLES = ("HYDRA_HOST_FILE", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "PBS_NODEFILE",
                  "LSB_MCPU_HOSTS", "PE_HOSTFILE", "COBALT_NODEFILE", "LOADL_HOSTFILE")
USAGE = f"""usage: python -m minitfm.launch MPIEXEC_ARGUMENTS...

Runs mpiexec with these arguments, e.g. `python -m minitfm.launch -n 2 python train_wmt.py
--out runs/wmt ...`, so that closing the terminal stops the training with a checkpoint
(status 129) instead of killing its workers unsaved. Ctrl-C and SIGTERM stop it as they stop
mpiexec.

The number of workers (-n) must be a whole number of 1 or more. On one machine, one worker per
core is the fastest; more run, with a warning, up to {MAX_WORKERS_PER_CORE} per core."""


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
        check_counts(argv)
        mpiexec = find_mpiexec()
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exits.BAD_INPUT
    if os.name != "posix":
        return subprocess.call([mpiexec, *argv])
    return _launch([mpiexec, *argv])


def check_counts(argv: list[str], environ=os.environ) -> None:
    """Refuse a count of workers in mpiexec's arguments ``argv`` that cannot work, and warn
    where there are more workers than cores (see the module's docstring); ``UsageError`` names
    the count and what to give instead."""
    counts, elsewhere = _counts(argv)
    total = sum(counts)
    elsewhere = elsewhere or any(environ.get(name) for name in HOST_VARIABLES)
    if elsewhere or total <= 1:
        return
    cores = placement.available_cores()
    given = f"-n {total}" if len(counts) == 1 else f"{' + '.join(map(str, counts))} workers"
    most = cores * MAX_WORKERS_PER_CORE
    if total > most:
        raise UsageError(
            f"{given}: more workers than this machine can run well: this process may use "
            f"{placement.count(cores, 'core')}, and at most {most} workers "
            f"({MAX_WORKERS_PER_CORE} per core) are started on one machine; use -n {cores} or "
            f"fewer (one per core, the fastest), or spread the workers over several machines "
            f"with mpiexec's -hosts or -f; nothing was started")
    allowed = _open_files_limit()
    needed = total * FILES_PER_WORKER + LAUNCHER_FILES
    if allowed is not None and needed > allowed:
        raise UsageError(
            f"{given}: mpiexec keeps {FILES_PER_WORKER} files open per worker, about {needed} "
            f"in all, more than the {allowed} this process may open (ulimit -n); raise the "
            f"limit (ulimit -n {2 * needed}) or use -n "
            f"{max(1, (allowed - LAUNCHER_FILES) // FILES_PER_WORKER)} or fewer; nothing was "
            f"started")
    if total > cores:
        print(f"warning: {given} starts {total} workers on the {placement.count(cores, 'core')} "
              f"this process may use: they take turns on the cores, which is slower than one "
              f"worker per core (-n {cores})", file=sys.stderr, flush=True)


def _counts(argv: list[str]) -> tuple[list[int], bool]:
    """The number of workers of each program of mpiexec's arguments (``A : B``: two programs;
    1 where no ``-n`` is given, MPICH's default on one machine), and whether an option places
    workers on other machines."""
    counts, elsewhere = [], False
    for segment in _segments(argv):
        count, words = None, iter(segment)
        for word in words:
            if not word.startswith("-") or word == "-":
                break                           # the program: the rest are its arguments
            name, equals, value = word.lstrip("-").partition("=")
            elsewhere = elsewhere or name in _HOSTS
            if not equals:
                taken = [next(words, None) for _ in range(
                    2 if name in _TWO_VALUES else 1 if name in _ONE_VALUE else 0)]
                value = taken[0] if taken else None
            if name in _COUNTS:
                count = _count(name, value)
        counts.append(1 if count is None else count)
    return counts, elsewhere


def _segments(argv: list[str]) -> list[list[str]]:
    """mpiexec's arguments cut at each ``:``, one part per program."""
    parts = [[]]
    for word in argv:
        if word == ":":
            parts.append([])
        else:
            parts[-1].append(word)
    return parts


def _count(option: str, text: str | None) -> int:
    """The count ``text`` of ``-n`` (or ``-np``), a whole number of 1 or more."""
    if text is None:
        raise UsageError(f"-{option} needs the number of workers after it, e.g. -{option} 2")
    if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:
        raise UsageError(f"-{option} {text}: the number of workers must be a whole number of 1 "
                         f"or more, e.g. -{option} 2; nothing was started")
    return int(text)


def _open_files_limit() -> int | None:
    """The open files this process (and so mpiexec) may have, or None where unknown."""
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else soft


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
