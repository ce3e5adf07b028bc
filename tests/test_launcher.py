"""A run under ``mpiexec`` survives the launcher's end (minitfm.launcher): SIGHUP to the launcher's
process group (a closed terminal) or to the launcher alone stops every worker after the same
update, rank 0 saves a checkpoint and says how to resume, and every worker exits with 129; SIGTERM
to the launcher does the same with 143; a worker killed outright still ends the others at once.

Each run is ``mpiexec -n 2 python train_toy.py`` under a small reaper (a child subreaper, Linux),
so that the workers' own exit statuses can be read once the launcher is gone. Every wait is for
an event (a file, a process's end), with a generous deadline, never a fixed sleep: these tests
pass on a machine whose cores are busy."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minitfm import checkpoint
from tests.test_distributed import ENV, mpi  # noqa: F401  (a fixture)

ROOT = Path(__file__).resolve().parents[1]
TOY = ["--task", "copy", "--length", "5", "--vocab", "5", "--batch-size", "8", "--preset", "tiny",
       "--eval-size", "10", "--examples", "0", "--quiet", "--steps", "1000000"]
DEADLINE = 180        # seconds: the longest any of these runs may take, however busy the machine

# Starts the command of its arguments in a session of its own, says its pid, reaps it and every
# process orphaned under it (the workers, once their launcher is gone) and prints their statuses.
REAPER = """
import ctypes, json, os, subprocess, sys
if ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) != 0:        # PR_SET_CHILD_SUBREAPER
    sys.exit("cannot become a child subreaper")
launcher = subprocess.Popen(sys.argv[1:], start_new_session=True)
print(launcher.pid, flush=True)
statuses = {}
while True:
    try:
        pid, status = os.waitpid(-1, 0)
    except ChildProcessError:
        break
    statuses[pid] = os.waitstatus_to_exitcode(status)
print(json.dumps(statuses), flush=True)
"""

pytestmark = [pytest.mark.mpi,
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="reads the workers' statuses as their child subreaper")]


def mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else "mpiexec"


class Run:
    """train_toy.py with two workers under mpiexec, stopped by ``stop(run)`` once it trains:
    ``launcher`` its pid, ``pids`` the workers' pids by rank (from the run's header), ``out``
    what it printed, ``statuses`` {pid: exit status} of the launcher and every process that
    ended under it, ``seconds`` from the stop to the end of the last of them."""

    def __init__(self, out_dir: Path, stop) -> None:
        process = subprocess.Popen(
            [sys.executable, "-c", REAPER, mpiexec(), "-n", "2", sys.executable,
             str(ROOT / "train_toy.py"), *TOY, "--out", str(out_dir)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        try:
            self.launcher = int(process.stdout.readline())
            header = ""
            while "2 workers: " not in header:
                line = process.stdout.readline()
                assert line, process.communicate()
                header += line
            self.pids = {int(r): int(p) for r, p in re.findall(r"rank (\d) pid (\d+)", header)}
            deadline = time.monotonic() + DEADLINE
            while not (out_dir / "log.jsonl").exists():       # training is under way
                assert process.poll() is None, process.communicate()
                assert time.monotonic() < deadline, "the run did not start training"
                time.sleep(0.05)
            stop(self)
            stopped = time.monotonic()
            out, self.err = process.communicate(timeout=DEADLINE)
            self.seconds = time.monotonic() - stopped
        finally:
            if process.poll() is None:
                process.kill()
        *printed, last = out.strip().splitlines()
        self.out = header + "\n".join(printed)
        self.statuses = {int(pid): status for pid, status in json.loads(last).items()}

    def worker_statuses(self) -> list[int | None]:
        return [self.statuses.get(self.pids[rank]) for rank in (0, 1)]

    def assert_stopped(self, out_dir: Path, words: str) -> None:
        """Said once by rank 0 (no traceback), and a checkpoint of that step."""
        assert "Traceback" not in self.err and "error" not in self.err.lower(), self.err
        stops = re.findall(rf"{words} at step (\d+); checkpoint (\S+) saved; continue with the "
                           rf"same options and --out {re.escape(str(out_dir))} --resume", self.out)
        assert len(stops) == 1, self.out + self.err
        step = int(stops[0][0])
        assert [s for s, _ in checkpoint.list_checkpoints(out_dir)] == [step]
        assert checkpoint.load(stops[0][1]).step == step


@pytest.mark.parametrize("to", ["the launcher's group", "the launcher alone"])
def test_sighup_to_the_launcher_stops_every_worker_with_a_checkpoint(mpi, tmp_path,  # noqa: F811
                                                                      to):
    out = tmp_path / "run"
    send = os.killpg if to == "the launcher's group" else os.kill
    run = Run(out, lambda run: send(run.launcher, signal.SIGHUP))
    assert run.statuses[run.launcher] == -signal.SIGHUP          # the launcher dies of it
    run.assert_stopped(out, "stopped by SIGHUP")
    assert run.worker_statuses() == [129, 129], (run.statuses, run.pids, run.err)


def test_sigterm_to_the_launcher_stops_every_worker_with_a_checkpoint(mpi, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    run = Run(out, lambda run: os.kill(run.launcher, signal.SIGTERM))
    run.assert_stopped(out, "stopped by SIGTERM")
    assert run.statuses[run.launcher] == 143                    # every worker's status


def test_a_worker_killed_outright_still_ends_the_other_at_once(mpi, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    run = Run(out, lambda run: os.kill(run.pids[1], signal.SIGKILL))
    assert run.worker_statuses()[0] == 1, (run.statuses, run.err)   # ended, not stopped
    assert run.statuses[run.launcher] != 0 and "stopped by" not in run.out
    assert run.seconds < 60             # at once, not after the grace of a worker that waits
    assert checkpoint.latest(out) is None
