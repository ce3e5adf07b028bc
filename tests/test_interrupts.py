"""Ctrl-C and SIGTERM outside training, through the real command lines: ``translate``,
``train_lm.py --sample`` and ``average`` stop at once with 130 / 143 and one line, no traceback;
what translate and sampling printed stays, and average leaves no output file, nor a part of
one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from minitfm import checkpoint
from minitfm.models import translator
from tests.test_exit_statuses import LM, TEXT
from tests.test_translate import vocab, write_checkpoint  # noqa: F401  (a fixture)
from tests import forkserver

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "MINITFM_BACKEND": "numpy"}
SIGNALS = [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "stopped by SIGTERM")]

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(),
                                reason="reads a process's signal handlers from /proc")


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def wait_until_handled(process: subprocess.Popen) -> None:
    """Until the command has installed its handlers: it runs its work (not Python's start-up)."""
    deadline = time.monotonic() + 60
    while not catches(process.pid, signal.SIGTERM):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the command never took its signals"
        time.sleep(0.005)


def assert_stopped(process: subprocess.Popen, err: str, status: int, words: str) -> None:
    assert process.returncode == status, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == words and err.count(words) == 1, err


def signalled(process: subprocess.Popen, signum: int, status: int, words: str) -> bytes:
    """Send ``signum`` to a command that is printing; it stops at once, as it should: the rest
    of what it printed."""
    process.send_signal(signum)
    rest = process.stdout.read()            # "at once" is shown by what was printed: the callers
    err = process.stderr.read()             # check it stops far short of the end
    process.wait(timeout=60)
    assert_stopped(process, err.decode(), status, words)
    return rest


@pytest.fixture(scope="module")
def translator_ckpt(tmp_path_factory, vocab):  # noqa: F811
    return write_checkpoint(tmp_path_factory.mktemp("tr") / "tiny.npz", vocab)


@pytest.mark.parametrize("signum, status, words", SIGNALS)
def test_translate_stops_at_once_and_what_it_printed_stays(translator_ckpt, signum, status,
                                                           words):
    lines = 20000
    process = forkserver.Popen(
        [sys.executable, "-m", "minitfm.translate", "--checkpoint", translator_ckpt, "--beam", "2",
         "--batch-size", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=ENV)

    def feed():                           # more than a pipe holds: the command reads as it goes
        try:
            process.stdin.write(b"a man is riding a bike\n" * lines)
            process.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
    threading.Thread(target=feed, daemon=True).start()
    first = process.stdout.readline()                           # translating now
    assert first.endswith(b"\n")
    printed = first + signalled(process, signum, status, words)
    assert printed.endswith(b"\n")                              # whole lines only
    assert 1 <= printed.count(b"\n") < lines                    # the rest was not started
    assert printed.count(b"\n") % 16 == 0                       # whole blocks of 16 lines


@pytest.fixture(scope="module")
def lm_ckpt(tmp_path_factory):
    """A tiny language model's last checkpoint, trained through the command line."""
    directory = tmp_path_factory.mktemp("lm")
    (directory / "input.txt").write_text(TEXT)
    done = forkserver.run([sys.executable, str(ROOT / "train_lm.py"), "--data",
                           str(directory / "input.txt"), *LM, "--out", str(directory / "run")],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr
    return checkpoint.latest(directory / "run")


@pytest.mark.parametrize("signum, status, words", SIGNALS)
def test_sampling_stops_at_once_and_what_it_printed_stays(lm_ckpt, signum, status, words):
    wanted = 200000                       # minutes of streaming, were it not stopped
    process = forkserver.Popen(
        [sys.executable, str(ROOT / "train_lm.py"), "--sample", "--checkpoint", str(lm_ckpt),
         "--max-new-tokens", str(wanted)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=ENV)
    first = process.stdout.read(1)                              # streaming now
    rest = signalled(process, signum, status, words)
    assert 1 <= len(first + rest) < wanted                      # what it printed stays


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Enough checkpoints of a model big enough that averaging them takes seconds."""
    directory = tmp_path_factory.mktemp("run")
    cfg = translator.Config.preset("tiny", src_vocab=20000, tgt_vocab=20000, d_model=64)
    params = translator.init_params(cfg, seed=0, dtype=np.float32)
    for step in range(1, 41):
        checkpoint.save(directory / f"checkpoint_{step:08d}.npz", params, step=step,
                        config=cfg.to_dict(), vocab_id="numbers")
    return directory


@pytest.mark.parametrize("signum, status, words", SIGNALS)
def test_average_stops_at_once_and_leaves_no_output(checkpoints, tmp_path, signum, status,
                                                    words):
    output = tmp_path / "averaged.npz"
    inputs = {p: p.read_bytes() for p in sorted(checkpoints.iterdir())[-3:]}
    process = forkserver.Popen(
        [sys.executable, "-m", "minitfm.average", "--inputs", str(checkpoints), "--last", "40",
         "--output", str(output)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=ENV)
    wait_until_handled(process)
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert_stopped(process, err, status, words)
    assert list(tmp_path.iterdir()) == []                       # no output, no temporary
    assert not [p for p in checkpoints.iterdir() if not p.name.startswith("checkpoint_")]
    assert all(p.read_bytes() == data for p, data in inputs.items())
