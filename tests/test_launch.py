"""``python -m minitfm.launch``: mpiexec, with a closed terminal that stops the workers with a
checkpoint (status 129) instead of killing them unsaved; Ctrl-C and SIGTERM as under mpiexec.

The ``mpi`` tests run train_toy.py with two workers through MPICH (the ``[mpi]`` extra), under
hard timeouts that end every process of the run; they skip where MPI cannot run."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import subprocess
import sys
import termios
import time

import pytest

from minitfm import checkpoint
from minitfm.cli import launch
from minitfm.cli.exits import UsageError
from minitfm.training.stops import HANGUP_VARIABLE, StopRequests

from .test_distributed import ENV, ROOT, TIMEOUT, finish, mpi  # noqa: F401  (mpi: a fixture)


def test_without_arguments_it_says_how_to_use_it(capsys):
    assert launch.main([]) == 2
    assert "python -m minitfm.launch -n 2 python train_wmt.py" in capsys.readouterr().err


def test_without_mpiexec_it_says_how_to_install_one(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UsageError, match=r'pip install -e "\.\[mpi\]"'):
        launch.find_mpiexec()


def test_the_launchers_stand_in_signal_is_taken_for_sighup(monkeypatch):
    monkeypatch.setenv(HANGUP_VARIABLE, "SIGUSR1")
    with pytest.raises(KeyboardInterrupt), StopRequests() as stops:
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(5)                               # the handler raises before this ends
    assert stops.signum == signal.SIGHUP


def test_elsewhere_sigusr1_is_not_a_stop(monkeypatch):
    monkeypatch.delenv(HANGUP_VARIABLE, raising=False)
    with StopRequests():
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


# ---- two training workers through MPICH ----------------------------------------------------

def toy(out) -> list[str]:
    return [sys.executable, "-m", "minitfm.launch", "-n", "2", sys.executable,
            str(ROOT / "train_toy.py"), "--preset", "tiny", "--out", str(out), "--quiet",
            "--eval-size", "20", "--examples", "0", "--max-steps", "100000"]


def wait_for_training(out, started: float) -> None:
    while not (out / "log.jsonl").exists():
        assert time.monotonic() - started < TIMEOUT / 2, "training did not start"
        time.sleep(0.05)


def signalled_while_training(out, send):
    """The run of :func:`toy` in a process group of its own, given ``send(launcher_pid)`` once
    its workers train."""
    started = time.monotonic()
    process = subprocess.Popen(toy(out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=ENV, start_new_session=True)
    try:
        wait_for_training(out, started)
        send(process.pid)
    finally:
        run = finish(process, started)
    return run


def assert_saved_where_it_stopped(out, text: str, signame: str) -> None:
    stops = re.findall(rf"stopped by {signame} at step (\d+); checkpoint (\S+) saved; continue "
                       rf"with the same options and --out \S+ --resume", text)
    assert len(stops) == 1, text                                    # said once, by rank 0
    step = int(stops[0][0])
    assert [s for s, _ in checkpoint.list_checkpoints(out)] == [step]
    assert checkpoint.load(stops[0][1]).step == step


@pytest.mark.mpi
@pytest.mark.parametrize("to", ["group", "launcher"])
def test_sighup_stops_every_worker_with_a_checkpoint(mpi, tmp_path, to):
    """SIGHUP to the process group (what closing a terminal sends) or to the launcher alone."""
    out = tmp_path / "run"
    kill = os.killpg if to == "group" else os.kill
    run = signalled_while_training(out, lambda pid: kill(pid, signal.SIGHUP))
    assert run.returncode == 129, run.stderr                       # 128 + SIGHUP, as one process
    assert_saved_where_it_stopped(out, run.stdout, "SIGHUP")


@pytest.mark.mpi
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_and_ctrl_c_stop_as_under_mpiexec(mpi, tmp_path, signum):
    out = tmp_path / "run"
    run = signalled_while_training(out, lambda pid: os.kill(pid, signum))
    assert run.returncode == 128 + signum, run.stderr
    name = "interrupted" if signum == signal.SIGINT else "stopped by SIGTERM"
    assert len(re.findall(rf"{name} at step \d+; checkpoint \S+ saved", run.stdout)) == 1
    assert len(checkpoint.list_checkpoints(out)) == 1


@pytest.mark.mpi
def test_a_closed_terminal_stops_every_worker_with_a_checkpoint(mpi, tmp_path):
    """The launcher in a terminal of its own (a pseudo-terminal it controls); the terminal is
    closed while the workers train: the kernel hangs it up, the launcher gets SIGHUP, and every
    later write to the terminal fails. The workers still stop together and save."""
    out = tmp_path / "run"
    terminal, inside = pty.openpty()

    def control_the_terminal():                     # in the child, after setsid
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    started = time.monotonic()
    process = subprocess.Popen(toy(out), stdin=inside, stdout=inside, stderr=inside, env=ENV,
                               start_new_session=True, preexec_fn=control_the_terminal)
    os.close(inside)
    try:
        header = b""
        while b"rank 1 pid" not in header:          # the header names every worker's pid
            assert time.monotonic() - started < TIMEOUT / 2, header
            header += os.read(terminal, 4096)
        pids = [int(p) for p in re.findall(rb"rank \d pid (\d+)", header)]
        wait_for_training(out, started)
        os.close(terminal)                          # the terminal closes
        status = process.wait(timeout=TIMEOUT)
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    assert status == 129
    saved = checkpoint.list_checkpoints(out)
    assert len(saved) == 1 and checkpoint.load(saved[0][1]).step == saved[0][0]
    for pid in pids:                                # no worker left behind
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
