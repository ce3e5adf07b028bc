"""Tests of minitfm.training.rundir: the layout of a run directory, the log cut back on resume, run.json,
checkpoint rotation, and errors that name the file that could not be written."""

import errno
import json

import pytest

from minitfm import checkpoint
from minitfm.training import rundir
from minitfm.training.record import RUNNING
from minitfm.training.rundir import (HOLDER_NAME, LOCK_NAME, LOG_NAME, RUN_INFO_NAME, RunDirectory,
                            WriteFailed)


def test_prepare_creates_the_directory_and_writes_run_info(tmp_path):
    run = RunDirectory.open(tmp_path / "a" / "run", keep_last=2)
    assert run.latest_checkpoint() is None                     # not there yet: nothing to read
    run.prepare(0, {"args": {"steps": 3}})
    record = json.loads((tmp_path / "a" / "run" / RUN_INFO_NAME).read_text())
    assert record["args"] == {"steps": 3} and record["outcome"] == RUNNING
    assert {"command", "started"} <= set(record) and "resumes" not in record
    assert sorted(p.name for p in (tmp_path / "a" / "run").iterdir()) == [
        RUN_INFO_NAME, LOCK_NAME, HOLDER_NAME]
    run.close()                                                 # the holder's details go
    assert sorted(p.name for p in (tmp_path / "a" / "run").iterdir()) == [RUN_INFO_NAME,
                                                                          LOCK_NAME]
    with RunDirectory.open(tmp_path / "b") as other:
        other.prepare(0, None)
        assert sorted(p.name for p in (tmp_path / "b").iterdir()) == [LOCK_NAME, HOLDER_NAME]
    assert not (tmp_path / "b").exists()       # made by the open and left empty: removed again


def test_the_log_is_cut_back_to_the_resumed_step(tmp_path):
    run = RunDirectory.open(tmp_path)
    for step in (1, 2, 2, 3, 4):
        run.append_log({"step": step, "loss": float(step)})
    with open(tmp_path / LOG_NAME, "a") as f:
        f.write('{"step": 5, "lo')                             # a line a crash cut short
    assert run.prepare(2, None) == (1, 2)          # one line cut short, two of later steps
    lines = [json.loads(line) for line in (tmp_path / LOG_NAME).read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 2]
    replaced = (tmp_path / rundir.REPLACED_NAME).read_text().splitlines()
    assert [json.loads(line) for line in replaced] == [{"step": 3, "loss": 3.0},
                                                       {"step": 4, "loss": 4.0}]
    run.append_log({"step": 3, "loss": 0.5})
    assert json.loads((tmp_path / LOG_NAME).read_text().splitlines()[-1]) == {"step": 3,
                                                                              "loss": 0.5}


def test_checkpoints_are_named_by_step_and_rotated(tmp_path):
    run = RunDirectory.open(tmp_path, keep_last=2)
    written = []
    for step in (1, 2, 3):
        path = run.save_checkpoint(step, lambda p: (written.append(p), open(p, "wb").close()))
        run.rotate(path)
    assert written == [checkpoint.checkpoint_path(tmp_path, step) for step in (1, 2, 3)]
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path)] == [2, 3]
    assert run.latest_checkpoint() == run.checkpoint_path(3) == written[-1]


def test_a_checkpoint_that_cannot_be_written_names_the_intact_one(tmp_path):
    run = RunDirectory.open(tmp_path)

    def disk_full(path):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    with pytest.raises(WriteFailed) as error:
        run.save_checkpoint(4, disk_full, last_checkpoint="checkpoint_00000002.npz")
    message = str(error.value)
    assert f"cannot write checkpoint {run.checkpoint_path(4)}: No space left on device" in message
    assert "the previous checkpoint checkpoint_00000002.npz is intact" in message
    assert "--resume" in message
    with pytest.raises(ValueError, match="not an OSError"):     # other errors pass through
        run.save_checkpoint(4, lambda p: (_ for _ in ()).throw(ValueError("not an OSError")))


def test_an_unwritable_log_names_the_log(tmp_path, monkeypatch):
    def read_only(path, mode="r", *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    run = RunDirectory.open(tmp_path)
    monkeypatch.setattr(rundir, "open", read_only, raising=False)
    with pytest.raises(WriteFailed, match=f"cannot write the log {tmp_path / LOG_NAME}: "
                                          rf"Read-only file system \(.* free in {tmp_path}\); "
                                          f"no checkpoint of this run"):
        run.append_log({"step": 1})


def test_a_directory_that_cannot_be_created(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(WriteFailed, match="cannot write the run directory .*Not a directory"):
        RunDirectory.open(blocker / "run").prepare(0, None)


def test_keep_last_must_keep_one():
    with pytest.raises(ValueError, match="keep_last must be >= 1"):
        RunDirectory.open("run", keep_last=0)
