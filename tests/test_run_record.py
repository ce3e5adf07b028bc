"""The record of a run, ``run.json``, through the real command line: the first command's options
stay as written, every resume is appended with its own command, options, start and outcome
(finished, stopped by a signal, failed on a loss that ran off or a file too large, killed
without a word), and a command refused before training changes nothing in it."""

from __future__ import annotations

import json
import signal
import time

from minitfm import checkpoint
from minitfm.cli import exits
from minitfm.training import record as record_module, rundir
from minitfm.training.rundir import LOG_NAME, RUN_INFO_NAME
from tests.test_faults import finish, toy, wait_for


def record(out) -> dict:
    return json.loads((out / RUN_INFO_NAME).read_text())


def test_resumes_are_appended_and_the_start_is_kept(tmp_path):
    assert finish(toy("--max-steps", 4, "--out", tmp_path, "--examples", 0))[0] == 0
    started = record(tmp_path)
    assert started["args"]["lr_factor"] == 0.3 and started["args"]["resume"] is False
    assert started["outcome"] == "finished" and started["step"] == 4
    assert "--max-steps 4" in started["command"] and "resumes" not in started

    # a resume whose loss runs off: the start stays, the resume says how it failed
    code, _, err = finish(toy("--max-steps", 40, "--lr-factor", 1e6, "--log-every", 2,
                              "--out", tmp_path, "--resume"))
    assert code == exits.FAILED and "loss" in err
    after = record(tmp_path)
    assert {k: after[k] for k in started} == started          # the first command, as written
    [failed] = after["resumes"]
    assert failed["args"]["lr_factor"] == 1e6 and failed["args"]["resume"] is True
    assert failed["from_step"] == 4 and failed["outcome"].startswith("failed: the training loss")
    assert failed["last_checkpoint"] == "checkpoint_00000004.npz"
    assert "--lr-factor 1000000.0" in failed["command"] and "config" not in failed

    # refused before training (other model options): nothing changes
    before = (tmp_path / RUN_INFO_NAME).read_bytes()
    code, _, err = finish(toy("--max-steps", 8, "--d-model", 32, "--out", tmp_path, "--resume"))
    assert code == exits.BAD_INPUT
    assert "--d-model: the run has 8 (its preset's), now 32" in err, err
    assert (tmp_path / RUN_INFO_NAME).read_bytes() == before

    # the same value as the preset's, now given: accepted
    code, _, err = finish(toy("--max-steps", 8, "--d-model", 8, "--out", tmp_path, "--resume",
                              "--examples", 0))
    assert code == 0, err
    assert f"moved to {tmp_path / rundir.REPLACED_NAME}" in err      # the failed session's lines
    replaced = [json.loads(line) for line in
                (tmp_path / rundir.REPLACED_NAME).read_text().splitlines()]
    assert replaced and all(r["step"] > 4 for r in replaced)
    done = record(tmp_path)
    assert [r["outcome"] for r in done["resumes"]][1:] == ["finished"]
    assert done["resumes"][1]["from_step"] == 4 and done["resumes"][1]["step"] == 8
    assert done["args"] == started["args"]


def test_a_stopped_and_a_killed_session_are_recorded(tmp_path):
    process = toy("--max-steps", 1_000_000, "--out", tmp_path)
    wait_for(tmp_path / LOG_NAME, process)
    process.send_signal(signal.SIGTERM)
    assert finish(process)[0] == 128 + signal.SIGTERM
    stopped = record(tmp_path)
    assert stopped["outcome"] == "stopped by SIGTERM"
    [(step, _)] = checkpoint.list_checkpoints(tmp_path)
    assert stopped["step"] == step

    process = toy("--max-steps", 1_000_000, "--out", tmp_path, "--resume")
    deadline = time.monotonic() + 60
    while "resumes" not in record(tmp_path):             # written whole: never half a file
        assert process.poll() is None and time.monotonic() < deadline, finish(process)
        time.sleep(0.02)
    assert record(tmp_path)["resumes"][0]["outcome"] == record_module.RUNNING
    process.kill()                                       # no word from it
    finish(process)
    code, _, err = finish(toy("--max-steps", 1, "--out", tmp_path, "--resume", "--examples", 0))
    assert code == 0, err
    killed, nothing_to_do = record(tmp_path)["resumes"]
    assert killed["outcome"].startswith("ended unrecorded") and killed["from_step"] == step
    assert nothing_to_do["outcome"] == "finished"
    assert record(tmp_path)["outcome"] == "stopped by SIGTERM"     # the start, as it ended


def test_a_resume_that_cannot_write_keeps_the_record(tmp_path):
    assert finish(toy("--max-steps", 4, "--out", tmp_path, "--examples", 0))[0] == 0
    started = record(tmp_path)
    size = (tmp_path / "checkpoint_00000004.npz").stat().st_size
    code, _, err = finish(toy("--max-steps", 8, "--lr-factor", 2, "--out", tmp_path, "--resume",
                              limit_file_size=size // 2))
    assert code == exits.FAILED and "File too large" in err
    after = record(tmp_path)
    assert after["args"] == started["args"] and after["outcome"] == "finished"
    [failed] = after["resumes"]
    assert failed["outcome"].startswith("failed: cannot write checkpoint")
    assert failed["args"]["lr_factor"] == 2


def test_a_fresh_start_keeps_an_earlier_record_and_an_unreadable_one_is_kept_aside(tmp_path):
    (tmp_path / RUN_INFO_NAME).write_text('{"args": {"max_steps": 9}, "outcome": "runn')
    assert finish(toy("--max-steps", 2, "--out", tmp_path, "--examples", 0))[0] == 0
    kept = tmp_path / (RUN_INFO_NAME + record_module.UNREADABLE_SUFFIX)
    assert kept.read_text() == '{"args": {"max_steps": 9}, "outcome": "runn'
    assert record(tmp_path)["outcome"] == "finished" and "earlier" not in record(tmp_path)

    first = record(tmp_path)
    for path in tmp_path.glob("checkpoint_*.npz"):       # an attempt that left no checkpoint
        path.unlink()
    assert finish(toy("--max-steps", 3, "--out", tmp_path, "--examples", 0))[0] == 0
    again = record(tmp_path)
    assert again["earlier"] == [first] and again["args"]["max_steps"] == 3


def test_a_second_unreadable_record_is_kept_beside_the_first(tmp_path):
    (tmp_path / RUN_INFO_NAME).write_text('{"args": {"max_steps": 9}, "outcome": "runn')
    assert finish(toy("--max-steps", 1, "--out", tmp_path, "--examples", 0))[0] == 0
    (tmp_path / RUN_INFO_NAME).write_text('{"args": {"max_steps": 1}, "outc')
    code, _, err = finish(toy("--max-steps", 2, "--out", tmp_path, "--resume", "--examples", 0))
    assert code == 0, err
    first = tmp_path / (RUN_INFO_NAME + record_module.UNREADABLE_SUFFIX)
    second = tmp_path / (RUN_INFO_NAME + record_module.UNREADABLE_SUFFIX + ".1")
    assert first.read_text() == '{"args": {"max_steps": 9}, "outcome": "runn'    # not replaced
    assert second.read_text() == '{"args": {"max_steps": 1}, "outc'
    assert f"warning: {tmp_path / RUN_INFO_NAME} could not be read (" in err
    assert f"kept as {second}; a new record starts here" in err
    [resumed] = record(tmp_path)["resumes"]
    assert resumed["outcome"] == "finished" and resumed["from_step"] == 1
