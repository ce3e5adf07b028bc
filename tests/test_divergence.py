"""Tests of minitfm.training.divergence: NaN and Inf in a logged window, a loss far above chance (at once)
or above twice chance for windows in a row, the warmup included, and which checkpoint the error
names as good."""

import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from minitfm.training import divergence
from minitfm.training.divergence import (DIVERGED_WINDOWS, FAR_ABOVE_CHANCE, DivergenceWatch,
                                 TrainingDiverged)
from tests import forkserver


@dataclass
class Run:
    step: int = 0
    last_checkpoint: str | None = None


def test_the_error_names_the_step_and_the_checkpoint_to_go_back_to():
    error = divergence.diverged("the loss is nan", 7, Run(7, "ckpt_5"))
    assert isinstance(error, TrainingDiverged)
    assert "the loss is nan at step 7" in str(error)
    assert "the last good checkpoint, ckpt_5, is intact" in str(error)
    assert "--lr-factor" in str(error) and "--clip-norm" in str(error)
    written_after = divergence.diverged("x", "steps 3-4", Run(4, "ckpt_4"), good="")
    assert "x at steps 3-4" in str(written_after)
    assert "every checkpoint up to ckpt_4 was written after the loss ran off" in str(written_after)
    assert "no checkpoint was written" in str(divergence.diverged("x", 1, Run(1)))


def test_check_finite():
    divergence.check_finite(2.0, 1.5, 0.3, 1, Run(4))
    divergence.check_finite(2.0, 1.5, None, 1, Run(4))
    with pytest.raises(TrainingDiverged, match="loss is nan at steps 3-5"):
        divergence.check_finite(math.nan, 1.0, None, 3, Run(5))
    with pytest.raises(TrainingDiverged, match="loss is 1.0 at step 5"):
        divergence.check_finite(1.0, math.inf, None, 1, Run(5))
    with pytest.raises(TrainingDiverged, match="gradient norm is inf at step 5"):
        divergence.check_finite(1.0, 1.0, math.inf, 2, Run(5))


def test_a_loss_far_above_chance_stops_after_the_windows_in_a_row():
    run = Run()
    watch = DivergenceWatch(vocab=10, warmup=2, state=run)
    high = 2 * math.log(10) + 0.1
    for run.step in (1, 2):                          # during the warmup: below the limit
        watch.check(1.0)
    run.step, run.last_checkpoint = 3, "ckpt_3"
    watch.saved()
    for run.step in range(4, 4 + DIVERGED_WINDOWS - 1):
        watch.check(high)
    watch.check(1.0)                                 # one window below the limit starts afresh
    for run.step in range(10, 10 + DIVERGED_WINDOWS - 1):
        watch.check(high)
    run.last_checkpoint = "ckpt_11"
    watch.saved()                                    # saved while high: not a good checkpoint
    run.step += 1
    with pytest.raises(TrainingDiverged) as error:
        watch.check(high)
    assert f"above 2 ln V = {2 * math.log(10):.2f}" in str(error.value)
    assert f"for {DIVERGED_WINDOWS} logged windows, at" in str(error.value)
    assert f"at step {run.step}" in str(error.value)
    assert "the last good checkpoint, ckpt_3, is intact" in str(error.value)


def test_the_windows_above_twice_chance_count_during_the_warmup_too():
    run = Run()
    watch = DivergenceWatch(vocab=10, warmup=1000, state=run)
    high = 2 * math.log(10) + 0.1
    for run.step in range(10, 10 * DIVERGED_WINDOWS, 10):
        watch.check(high)
    run.step = 10 * DIVERGED_WINDOWS
    with pytest.raises(TrainingDiverged, match=f"for {DIVERGED_WINDOWS} logged windows during "
                                               f"the warmup, at .* at step {run.step};"):
        watch.check(high)


@pytest.mark.parametrize("step, when", [(5, " during the warmup"), (50, "")])
def test_one_window_far_above_chance_stops_at_once(step, when):
    run = Run(step=step, last_checkpoint="ckpt_4")
    watch = DivergenceWatch(vocab=10, warmup=20, state=run)
    watch.saved()
    far = FAR_ABOVE_CHANCE * math.log(10)
    watch.check(far)                                 # at the limit: not yet
    with pytest.raises(TrainingDiverged) as error:
        watch.check(far + 0.01)
    message = str(error.value)
    assert message.startswith(f"the training loss ran off{when}: {far + 0.01:.4g} per token, "
                              f"above {FAR_ABOVE_CHANCE:g} ln V = {far:.2f}")
    assert f"at step {step}; training stopped" in message
    assert "the last good checkpoint, ckpt_4, is intact" in message


def test_a_loss_at_the_limit_is_not_high():
    run = Run(step=10)
    watch = DivergenceWatch(vocab=4, warmup=1, state=run)
    for _ in range(2 * DIVERGED_WINDOWS):
        watch.check(2 * math.log(4))
    assert watch.high == 0


def test_a_vocabulary_below_two_is_refused():
    with pytest.raises(ValueError, match="at least 2 tokens"):
        DivergenceWatch(vocab=1, warmup=1, state=Run())


# ---- through the command line ---------------------------------------------------------------

def test_a_run_that_diverges_in_the_warmup_stops_at_the_first_log_line(tmp_path):
    """An absurd learning rate (the loss is hundreds of nats per token by step 10) in a warmup of
    1000 steps: the first log line, at step 10, stops the run with status 1 and one message."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "run"
    done = forkserver.run(
        [sys.executable, str(root / "train_toy.py"), "--task", "copy", "--length", "5", "--vocab",
         "5", "--batch-size", "8", "--preset", "tiny", "--eval-size", "10", "--quiet",
         "--max-steps", "200", "--warmup", "1000", "--lr-factor", "1e5", "--clip-norm", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(root), "MINITFM_BACKEND": "numpy"})
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("error:") == 1, done.stderr
    assert "error: the training loss ran off during the warmup: " in done.stderr
    assert f"above {FAR_ABOVE_CHANCE:g} ln V = " in done.stderr
    assert "at step 10; training stopped and no checkpoint was written" in done.stderr
    logged = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "loss" in r] == [10]
    assert logged[-1]["loss"] > FAR_ABOVE_CHANCE * math.log(9)     # 5 symbols + 4 special ids
