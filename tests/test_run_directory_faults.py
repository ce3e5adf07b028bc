"""Faults of the run directory through the real command lines: a resume that cannot write names the
newest checkpoint that passes the check, not "no checkpoint"; a run file that is a named pipe, a
device or a folder is refused at once, nothing written; a full disk while the log's replaced
lines are kept names that file; a record the disk fails to read is not taken for an unreadable
one; memory that runs out in a validation (the last one, one at a save, the time limit's) loses
no update; a loss that runs off keeps the last good checkpoint from rotation; an earlier run's
best checkpoint, alone in its directory, is never replaced."""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import pytest

from minitfm import checkpoint, usable
from minitfm.cli import exits
from minitfm.models import translator
from minitfm.training.rundir import LOCK_NAME, LOG_NAME, REPLACED_NAME, RUN_FILES, RUN_INFO_NAME
from tests.test_faults import ENV, ROOT, TOY, assert_clean_error, finish, snapshot, toy
from tests import forkserver

QUIET = [*TOY, "--examples", "0"]


def toy_run(*args, prefix=(), timeout: float = 60) -> tuple[int, str]:
    """train_toy.py (after ``prefix``: a wrapper and its options) to its end or ``timeout``;
    its status and stderr."""
    done = forkserver.run([sys.executable, *map(str, prefix), str(ROOT / "train_toy.py"), *QUIET,
                           *map(str, args)], capture_output=True, text=True, env=ENV,
                          timeout=timeout)
    return done.returncode, done.stderr


def on_failing_disk(*faults) -> list:
    return [ROOT / "tests" / "failing_disk.py", *faults, "--"]


def train(out, *args) -> None:
    code, _, err = finish(toy("--out", out, "--examples", 0, *args))
    assert code == 0, err


# ---- a write that fails names the checkpoint kept ------------------------------------------

@pytest.mark.parametrize("fault, reason", [("--read-only", "Read-only file system"),
                                           ("--full", "No space left on device")])
def test_a_resume_that_cannot_write_names_the_newest_checkpoint_that_passes(tmp_path, fault,
                                                                            reason):
    out = tmp_path / "run"
    train(out, "--max-steps", 6, "--save-every", 2)
    named = out / "checkpoint_00000006.npz"
    if fault == "--full":                   # the newest cut short: the one before is named
        named.write_bytes(named.read_bytes()[:1000])
        named = out / "checkpoint_00000004.npz"
    before = snapshot(out)
    code, err = toy_run("--max-steps", 10, "--resume", "--out", out,
                        prefix=on_failing_disk(fault, out))
    assert code == exits.FAILED and "Traceback" not in err, err
    assert f"error: cannot write the lock file {out / LOCK_NAME}: {reason}" in err
    assert f"the newest checkpoint that passes the checkpoint check, {named}, is intact" in err
    assert "no checkpoint of this run was written yet" not in err
    if fault == "--full":
        assert "once the newer ones are moved aside" in err
    else:
        assert "and continue with --resume" in err
    assert snapshot(out) == before


# ---- a run file that is not a regular file -------------------------------------------------

@pytest.mark.parametrize("name", [*RUN_FILES, "checkpoint_00000002.npz"])
def test_a_run_file_that_is_a_named_pipe_is_refused_at_once(tmp_path, name):
    os.mkfifo(tmp_path / name)
    code, err = toy_run("--max-steps", 4, "--save-every", 2, "--best-metric", "acc",
                        "--out", tmp_path, timeout=30)       # a run that opens it waits forever
    assert code == exits.BAD_INPUT, err
    assert_clean_error(err)
    assert f"error: {tmp_path / name} is a named pipe, where the run keeps a regular file" in err
    assert f"move it out of {tmp_path}, or choose another --out" in err
    assert os.listdir(tmp_path) == [name]                       # nothing written
    assert (tmp_path / name).is_fifo()


@pytest.mark.parametrize("make, what", [
    (lambda path: path.symlink_to("/dev/zero"), "a character device"),    # read forever
    (lambda path: path.mkdir(), "a directory"),                            # moved aside before
], ids=["device", "folder"])
def test_a_record_that_is_a_device_or_a_folder_is_refused(tmp_path, make, what):
    make(tmp_path / RUN_INFO_NAME)
    code, err = toy_run("--max-steps", 2, "--out", tmp_path, timeout=30)
    assert code == exits.BAD_INPUT, err
    assert_clean_error(err)
    assert f"{tmp_path / RUN_INFO_NAME} is {what}, where the run keeps a regular file" in err
    assert os.listdir(tmp_path) == [RUN_INFO_NAME]


# ---- a full disk while the replaced log lines are kept ---------------------------------------

def test_a_full_disk_while_keeping_the_replaced_log_lines_names_that_file(tmp_path):
    train(tmp_path, "--max-steps", 4)
    train(tmp_path, "--max-steps", 44, "--log-every", 1, "--resume")
    os.remove(tmp_path / "checkpoint_00000044.npz")         # a resume from step 4 makes 5-44 again
    before = snapshot(tmp_path)
    assert len(before[LOG_NAME]) > 4096
    code, _, err = finish(toy("--max-steps", 44, "--log-every", 1, "--out", tmp_path, "--resume",
                              limit_file_size=4096))        # the 40 lines moved are more
    assert code == exits.FAILED, err
    assert_clean_error(err)
    assert f"error: cannot write {tmp_path / REPLACED_NAME}: File too large (" in err
    assert "None" not in err
    assert f"the previous checkpoint {tmp_path / 'checkpoint_00000004.npz'} is intact" in err
    assert snapshot(tmp_path) == before                     # no line cut short, none lost


# ---- a record the disk fails to read ----------------------------------------------------------

def test_a_record_the_disk_fails_to_read_is_an_io_error_not_an_unreadable_record(tmp_path):
    train(tmp_path, "--max-steps", 2)
    before = snapshot(tmp_path)
    code, err = toy_run("--max-steps", 4, "--resume", "--out", tmp_path,
                        prefix=on_failing_disk("--eio", tmp_path / RUN_INFO_NAME))
    assert code == exits.FAILED, err
    assert_clean_error(err)
    assert f"error: {tmp_path / RUN_INFO_NAME}: reading it failed: Input/output error" in err
    assert "could not be read" not in err
    assert snapshot(tmp_path) == before


# ---- memory that runs out in a validation -----------------------------------------------------

# train_toy.py with its validation running out of memory, as a host memory limit makes it
OUT_OF_MEMORY_IN_VALIDATION = """
import runpy, sys
from minitfm.training.run import Run

def validate(self):
    raise MemoryError("Unable to allocate 119. GiB for an array")

Run._validate = validate
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("args, step", [
    (["--max-steps", 6, "--save-every", 4], 6),                         # the end of the run
    (["--max-steps", 10, "--valid-every", 3, "--save-every", 3], 3),    # a save step
    (["--max-steps", 100_000, "--time-limit", "0.001s"], None),        # the time limit's stop
], ids=["last-step", "save-step", "time-limit"])
def test_memory_running_out_in_a_validation_keeps_the_update_before_it(tmp_path, args, step):
    code, err = toy_run(*args, "--out", tmp_path, prefix=["-c", OUT_OF_MEMORY_IN_VALIDATION])
    assert code == exits.FAILED, err
    assert_clean_error(err)
    saved = checkpoint.list_checkpoints(tmp_path)
    step = saved[-1][0] if step is None else step
    path = checkpoint.checkpoint_path(tmp_path, step)
    assert saved[-1] == (step, path)
    assert usable.load(path, translator.KIND).ckpt.step == step
    assert (f"error: out of memory on the host's memory: Unable to allocate 119. GiB for an "
            f"array; after update {step}; its checkpoint, {path}, is saved: continue from it "
            f"with --resume; lower --batch-size") in err
    record = json.loads((tmp_path / RUN_INFO_NAME).read_text())
    assert record["outcome"].startswith("failed: out of memory") and record["step"] == step


# ---- a loss that runs off ---------------------------------------------------------------------

def test_a_loss_that_runs_off_keeps_the_checkpoint_it_names_from_rotation(tmp_path):
    code, err = toy_run("--max-steps", 60, "--lr-factor", 100, "--log-every", 1,
                        "--save-every", 1, "--keep-last", 1, "--out", tmp_path)
    assert code == exits.FAILED and "twice chance" in err, err
    named = re.search(r"the last good checkpoint, (\S+), is intact", err).group(1)
    newest = checkpoint.latest(tmp_path)
    assert named != newest and "--resume takes the newest checkpoint_*.npz" in err
    good = usable.load(named, translator.KIND).ckpt
    assert all(np.isfinite(array).all() for array in good.params.values())


# ---- an earlier run's best checkpoint ---------------------------------------------------------

@pytest.mark.parametrize("resume", [[], ["--resume"]], ids=["fresh", "resume"])
def test_an_earlier_runs_best_checkpoint_alone_is_never_replaced(tmp_path, resume):
    train(tmp_path, "--max-steps", 4, "--valid-every", 2, "--best-metric", "acc")
    for _, path in checkpoint.list_checkpoints(tmp_path):
        os.remove(path)                             # only checkpoint_best.npz is left of them
    before = snapshot(tmp_path)
    code, err = toy_run("--max-steps", 4, "--valid-every", 2, "--best-metric", "acc", *resume,
                        "--out", tmp_path)
    assert code == exits.BAD_INPUT, err
    assert_clean_error(err)
    assert f"{tmp_path} holds checkpoint_best.npz, the best checkpoint of an earlier run" in err
    assert snapshot(tmp_path) == before
