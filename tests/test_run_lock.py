"""One run per run directory, through the real command lines: a second trainer on the same
``--out`` (fresh or ``--resume``, any of the three) is refused at once with status 2 and a message
naming the holder, without touching a file; the first finishes with checkpoints of its own; a run
killed with ``kill -9`` leaves no stale lock; a file system without locks is refused unless
``--no-lock``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from minitfm import checkpoint
from minitfm.training.rundir import HOLDER_NAME, LOCK_NAME, RunDirectory, RunDirectoryBusy
from tests.test_distributed import _mpiexec, mpi  # noqa: F401  (a fixture)
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MINITFM_BACKEND": "numpy"}
FOREVER = 10**7         # steps: a holder that works until it is stopped
TOY = ["--task", "copy", "--length", "5", "--vocab", "5", "--batch-size", "8", "--preset", "tiny",
       "--eval-size", "10", "--examples", "0", "--quiet"]


def command(script: str, *args) -> list[str]:
    return [sys.executable, str(ROOT / script), *map(str, args)]


def start(script: str, *args) -> subprocess.Popen:
    return forkserver.Popen(command(script, *args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)


def run(script: str, *args) -> tuple[int, str, str]:
    done = forkserver.run(command(script, *args), capture_output=True, text=True, env=ENV,
                          timeout=120)
    return done.returncode, done.stdout, done.stderr


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` but the holder's details, by path: its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != HOLDER_NAME}


def wait_for_holder(out: Path, process: subprocess.Popen, what=lambda: True) -> dict:
    """The holder's details once ``process`` holds ``out`` (and ``what()`` is true)."""
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"{out} was not taken"
        try:
            holder = json.loads((out / HOLDER_NAME).read_text())
        except (OSError, ValueError):
            holder = None
        if holder and holder["pid"] == process.pid and what():
            return holder
        time.sleep(0.02)


def assert_refused(code: int, err: str, holder_pid: int) -> None:
    """Refused with the holder named. "At once" needs no clock: the holder keeps the directory
    all the while (the callers check it), so a second run that waited for it would never end."""
    assert code == 2, err
    assert "Traceback" not in err and err.count("error:") == 1, err
    assert "in use by another run" in err and f"pid {holder_pid} on {socket.gethostname()}" in err
    assert "started 20" in err                                  # the holder's start time
    assert "Wait for that run to finish" in err and f"kill {holder_pid}" in err
    assert "choose another --out" in err


def test_a_second_trainer_is_refused_at_once_and_the_first_keeps_its_own_checkpoints(tmp_path):
    out = tmp_path / "run"
    first = start("train_toy.py", *TOY, "--max-steps", FOREVER, "--save-every", 100, "--seed", 3,
                  "--out", out)
    holder = wait_for_holder(out, first, lambda: checkpoint.latest(out) is not None)
    assert holder["host"] == socket.gethostname() and "train_toy.py" in holder["command"]
    before = snapshot(out)
    for again in (["--seed", 4], ["--seed", 3, "--resume"]):      # pasted twice; or a resume
        code, _, err = run("train_toy.py", *TOY, "--max-steps", 200, *again, "--out", out)
        assert_refused(code, err, first.pid)
        assert first.poll() is None                     # the holder is still at work
    after = snapshot(out)
    for name, data in before.items():    # the refused runs changed nothing the first had saved
        if name in after and name != "log.jsonl":              # (the first goes on logging)
            assert after[name] == data, name
    assert after["log.jsonl"].startswith(before["log.jsonl"])
    first.send_signal(signal.SIGTERM)
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 143, stderr                  # stopped, saving, as documented
    latest = checkpoint.load(checkpoint.latest(out))
    assert latest.extra["seed"] == 3                                  # the first run's own
    records = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    steps = [record["step"] for record in records if "valid_acc" not in record]
    assert steps == list(range(10, 10 * len(steps) + 1, 10))   # one writer: each step once
    assert latest.step - 10 <= steps[-1] <= latest.step             # logged up to its stop
    assert not (out / HOLDER_NAME).exists()                          # released when it stopped


def test_a_run_killed_with_sigkill_leaves_no_stale_lock(tmp_path):
    out = tmp_path / "run"
    first = start("train_toy.py", *TOY, "--max-steps", FOREVER, "--save-every", 50, "--out", out)
    wait_for_holder(out, first, lambda: checkpoint.latest(out) is not None)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=60)
    saved = checkpoint.latest(out)
    step = checkpoint.load(saved).step
    code, stdout, err = run("train_toy.py", *TOY, "--max-steps", step + 10, "--out", out,
                               "--resume")
    assert code == 0, err
    assert checkpoint.load(checkpoint.latest(out)).step == step + 10


@pytest.mark.parametrize("script, args", [
    ("train_toy.py", TOY + ["--max-steps", "5"]),
    ("train_toy.py", TOY + ["--max-steps", "5", "--resume"]),
    ("train_lm.py", ["--data", "missing.txt", "--max-steps", "500"]),
    ("train_lm.py", ["--data", "missing.txt", "--max-steps", "500", "--resume"]),
    ("train_wmt.py", ["--trainpref", "missing/train", "--max-steps", "5"]),
    ("train_wmt.py", ["--trainpref", "missing/train", "--max-steps", "5", "--resume"]),
])
def test_every_trainer_takes_the_directory_before_reading_or_writing_it(tmp_path, script, args):
    """Held by this process: each trainer is refused before it reads anything (not even its
    missing data) or writes anything (no run.json, log, vocabulary or OUT/data)."""
    out = tmp_path / "run"
    with RunDirectory.open(out):
        before = snapshot(out)
        code, _, err = run(script, *args, "--out", out)
        assert_refused(code, err, os.getpid())
        assert snapshot(out) == before and sorted(p.name for p in out.iterdir()) == [
            LOCK_NAME, HOLDER_NAME]


def test_one_process_may_open_its_directory_twice_and_releases_it_with_the_last(tmp_path):
    out = tmp_path / "run"
    outer = RunDirectory.open(out)
    inner = RunDirectory.open(out)         # the command line, then the training loop
    holder = json.loads((out / HOLDER_NAME).read_text())
    assert holder["pid"] == os.getpid()
    inner.close()
    code, _, err = run("train_toy.py", *TOY, "--max-steps", 2, "--out", out)
    assert code == 2 and "in use by another run" in err
    outer.close()
    assert not (out / HOLDER_NAME).exists()
    code, _, err = run("train_toy.py", *TOY, "--max-steps", 2, "--out", out)
    assert code == 0, err


def test_in_process_second_opener_is_refused_by_the_holder_in_another_process(tmp_path):
    out = tmp_path / "run"
    holder = forkserver.Popen([sys.executable, "-c", (
        "import sys, time; from minitfm.training.rundir import RunDirectory; "
        f"d = RunDirectory.open({str(out)!r}); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirectoryBusy, match=f"pid {holder.pid} on"):
            RunDirectory.open(out)
    finally:
        holder.kill()
        holder.communicate()
    RunDirectory.open(out).close()                    # the OS released it with the process


NO_FLOCK = """\
import errno, fcntl, runpy, sys

def flock(fd, operation):
    raise OSError(errno.ENOSYS, "Function not implemented")

fcntl.flock = flock                 # as on a file system without file locks
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_a_file_system_without_locks_is_refused_unless_no_lock(tmp_path):
    wrapper = tmp_path / "no_flock.py"
    wrapper.write_text(NO_FLOCK)
    out = tmp_path / "run"

    def toy(*more):
        return forkserver.run([sys.executable, str(wrapper), str(ROOT / "train_toy.py"), *TOY,
                               "--max-steps", "3", "--out", str(out), *more],
                              capture_output=True, text=True, env=ENV, timeout=120)
    done = toy()
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("error:") == 1
    assert "does not support file locks" in done.stderr and "--no-lock" in done.stderr
    assert checkpoint.latest(out) is None and not (out / "log.jsonl").exists()
    done = toy("--no-lock")
    assert done.returncode == 0, done.stderr
    assert checkpoint.load(checkpoint.latest(out)).step == 3


@pytest.mark.mpi
def test_two_workers_are_refused_together_on_a_directory_in_use(tmp_path, mpi):
    """Under mpiexec, rank 0 takes the lock for all workers: on a directory in use, both end
    with status 2 and one message naming the holder."""
    out = tmp_path / "run"
    first = start("train_toy.py", *TOY, "--max-steps", FOREVER, "--save-every", 100, "--out", out)
    try:
        holder = wait_for_holder(out, first, lambda: checkpoint.latest(out) is not None)
        done = forkserver.run([_mpiexec(), "-n", "2", *command("train_toy.py", *TOY, "--max-steps",
                                                               20, "--out", out)],
                              capture_output=True, text=True, env=ENV, timeout=120)
        assert done.returncode == 2, done.stderr
        assert "Traceback" not in done.stderr and done.stderr.count("in use by another run") == 1
        assert f"pid {holder['pid']} on {socket.gethostname()}" in done.stderr
        assert first.poll() is None                     # refused while the holder works on
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
