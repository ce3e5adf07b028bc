"""Tests of train_toy.py: a shortened copy task learns in seconds; Ctrl-C and --resume work from
the command line."""

import json
import os
from pathlib import Path
from unittest import mock

import pytest

from minitfm import checkpoint
from minitfm.cli import exits, reporting
from minitfm.commands import train_toy as commands_train_toy
from minitfm.training.rundir import LOG_NAME

SCRIPT = Path(__file__).resolve().parents[1] / "train_toy.py"
SHORT_COPY = ["--task", "copy", "--length", "5", "--vocab", "5", "--batch-size", "32",
              "--warmup", "30", "--eval-size", "100", "--quiet"]


@pytest.fixture(scope="module")
def train_toy():
    """The command's module (a placement sets BLAS thread variables: restore the environment)."""
    with mock.patch.dict(os.environ):
        yield commands_train_toy


def read_log(directory):
    with open(os.path.join(directory, LOG_NAME)) as f:
        return [json.loads(line) for line in f]


def test_short_copy_run_learns(train_toy, tmp_path, capsys):
    assert train_toy.main(SHORT_COPY + ["--max-steps", "150", "--out", str(tmp_path)]) == 0
    log = read_log(tmp_path)
    losses = [r["nll"] for r in log if "nll" in r]
    assert losses[-1] < 0.25 * losses[0]
    accuracy = log[-1]["valid_acc"]
    assert accuracy > 0.5                 # chance: one in 5 ** 5 = 3125
    out = capsys.readouterr().out
    assert f"exact match on 100 held-out sequences: {100 * accuracy:.1f} %" in out
    assert out.count("  ->  ") == 5       # the examples


def test_interrupt_and_resume_from_the_command_line(train_toy, tmp_path, capsys, monkeypatch):
    run = ["--max-steps", "20", "--out", str(tmp_path), "--eval-size", "10"]
    calls = []

    def interrupted_batches(task, **kwargs):           # Ctrl-C while reading the 13th batch
        factory = original(task, **kwargs)

        def batches(epoch):
            for batch in factory(epoch):
                calls.append(1)
                if len(calls) == 13:
                    raise KeyboardInterrupt
                yield batch
        return batches

    original = train_toy.tasks.train_batches
    monkeypatch.setattr(train_toy.tasks, "train_batches", interrupted_batches)
    assert train_toy.main(SHORT_COPY + run) == reporting.EXIT_INTERRUPTED
    assert "interrupted at step 12" in capsys.readouterr().out
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path)] == [12]

    monkeypatch.setattr(train_toy.tasks, "train_batches", original)
    assert train_toy.main(SHORT_COPY + run + ["--resume"]) == 0
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path)] == [12, 20]
    assert [r["step"] for r in read_log(tmp_path) if "nll" in r] == [10, 20]
    capsys.readouterr()

    assert train_toy.main(SHORT_COPY + run) == exits.BAD_INPUT
    assert "already holds checkpoints" in capsys.readouterr().err
    assert train_toy.main(SHORT_COPY + run + ["--resume", "--length", "6"]) == exits.BAD_INPUT
    assert "--length: the run has 5, now 6" in capsys.readouterr().err


def test_task_defaults_and_overrides(train_toy, tmp_path):
    args = train_toy.parse_args(["--task", "sort", "--out", str(tmp_path)])
    assert (args.max_steps, args.batch_size) == (train_toy.TASK_DEFAULTS["sort"]["max_steps"],
                                              train_toy.TASK_DEFAULTS["sort"]["batch_size"])
    args = train_toy.parse_args(["--task", "sort", "--max-steps", "7", "--d-model", "32",
                                 "--vocab", "6", "--out", str(tmp_path)])
    cfg = train_toy.model_config(args)
    assert args.max_steps == 7 and cfg.d_model == 32 and cfg.src_vocab == cfg.tgt_vocab == 10
