"""Choosing by validation, through the command lines: the best checkpoint, the kept-best set,
patience, --max-epochs, ``average --best``, late dropout and the cool-down in updates, epochs or
``auto``, and resuming all of it bit for bit. Tiny models on tiny data: each run takes seconds.

The language model's text is made to overfit early: its training part follows a rule the
validation part never does (after "a" always "h", ...), so the validation loss falls while the
model learns the letters' frequencies, then rises as it learns the rule.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from minitfm import checkpoint, optim
from minitfm.cli import average, exits
from minitfm.commands import train_lm as commands_train_lm
from minitfm.commands import train_toy
from minitfm.training import phases, validation
from minitfm.training.rundir import BEST_NAME, LOG_NAME
from tests.test_train_wmt import TINY, corpus, train_wmt    # noqa: F401 (corpus: a fixture)

ROOT = Path(__file__).resolve().parents[1]
LM = ["--layers", "1", "--d-model", "32", "--heads", "2", "--d-ff", "64", "--block-size", "16",
      "--batch-size", "8", "--warmup", "5", "--lr", "3e-3", "--min-lr", "3e-3", "--dropout", "0",
      "--samples", "0", "--quiet", "--valid-every", "5"]


@pytest.fixture(scope="module")
def train_lm():
    """The command's module (a placement sets BLAS thread variables: restore the environment)."""
    with mock.patch.dict(os.environ):
        yield commands_train_lm


@pytest.fixture(autouse=True)
def numpy_only(numpy_backend):
    """The scripts select the backend globally: restore it after each test."""


@pytest.fixture(scope="module")
def peaking_text(tmp_path_factory) -> Path:
    """3,600 characters that follow a rule, then 400 (the validation tenth) that do not."""
    rng = np.random.default_rng(0)
    letters, p = list("abcdefgh"), [0.3, 0.2, 0.15, 0.1, 0.1, 0.05, 0.05, 0.05]
    rule = {"a": "h", "b": "g", "c": "f"}
    text: list[str] = []
    while len(text) < 3600:
        text.append(str(rng.choice(letters, p=p)))
        if text[-1] in rule:
            text.append(rule[text[-1]])
    text = text[:3600] + [str(c) for c in rng.choice(letters, size=400, p=p)]
    path = tmp_path_factory.mktemp("text") / "peaking.txt"
    path.write_text("".join(text), encoding="utf-8")
    return path


def read_log(directory) -> list[dict]:
    return [json.loads(line) for line in Path(directory, LOG_NAME).read_text().splitlines()]


def validations(directory) -> list[dict]:
    return [r for r in read_log(directory) if "valid_loss" in r]


def steps_on_disk(directory) -> list[int]:
    return [step for step, _ in checkpoint.list_checkpoints(directory)]


def assert_same_checkpoint(a: checkpoint.Checkpoint, b: checkpoint.Checkpoint) -> None:
    assert a.step == b.step
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])
    if a.optimizer_state is not None or b.optimizer_state is not None:
        for moment in ("m", "v"):
            for name in a.params:
                np.testing.assert_array_equal(a.optimizer_state[moment][name],
                                              b.optimizer_state[moment][name])
    for key in ("validation", "valid", "epoch", "batches_done", "tokens"):
        assert a.extra.get(key) == b.extra.get(key), key


# ---- the best checkpoint, the kept-best set, average --best ----------------------------------

def test_an_early_peak_is_kept_as_best_and_average_best_picks_it(train_lm, peaking_text,
                                                                  tmp_path):
    out = tmp_path / "run"
    assert train_lm.main(["--data", str(peaking_text), *LM, "--max-steps", "40", "--best-metric",
                          "loss", "--keep-best", "2", "--out", str(out)]) == 0
    valid = validations(out)
    assert [r["step"] for r in valid] == list(range(5, 41, 5))
    losses = {r["step"]: r["valid_loss"] for r in valid}
    ranked = sorted(losses, key=lambda step: (losses[step], step))
    best = ranked[0]
    assert best <= 20 and losses[40] > losses[best] + 0.3          # validation peaked early
    for line in valid:                           # every line: the best so far and its step
        so_far = sorted((loss, step) for step, loss in losses.items() if step <= line["step"])
        assert (line["best_valid_loss"], line["best_step"]) == so_far[0]

    # the two best and the two last are on disk: rotation spared the best
    assert steps_on_disk(out) == sorted(set(ranked[:2]) | {35, 40})
    named = checkpoint.load(out / BEST_NAME)
    assert_same_checkpoint(named, checkpoint.load(checkpoint.checkpoint_path(out, best)))
    assert named.extra["valid"]["valid_loss"] == losses[best]
    assert validation.recorded_metric(named) == ("valid_loss", losses[best])
    assert json.loads((out / "run.json").read_text())["best"] == {
        "metric": "valid_loss", "value": losses[best], "step": best, "checkpoint": BEST_NAME}

    assert average.main(["--inputs", str(out), "--best", "1", "--output",
                         str(tmp_path / "best1.npz")]) == 0
    one = checkpoint.load(tmp_path / "best1.npz")
    assert one.extra["averaged_from"] == [f"checkpoint_{best:08d}.npz"] and one.step == best
    for name in named.params:
        np.testing.assert_array_equal(one.params[name], named.params[name])
    assert "valid" not in one.extra and "validation" not in one.extra   # never validated itself
    assert average.main(["--inputs", str(out), "--best", "2", "--output",
                         str(tmp_path / "best2.npz")]) == 0
    two = checkpoint.load(tmp_path / "best2.npz")
    assert two.extra["averaged_from"] == [f"checkpoint_{s:08d}.npz" for s in sorted(ranked[:2])]
    # checkpoint_best.npz is a checkpoint like any other
    assert train_lm.main(["--sample", "--checkpoint", str(out / BEST_NAME),
                          "--prompt", "a", "--max-new-tokens", "5"]) == 0


def test_average_best_refuses_checkpoints_without_a_recorded_metric(train_lm, peaking_text,
                                                                     tmp_path, capsys):
    out = tmp_path / "plain"                     # no --best-metric: nothing is ranked
    assert train_lm.main(["--data", str(peaking_text), *LM, "--max-steps", "10", "--out",
                          str(out)]) == 0
    capsys.readouterr()
    output = tmp_path / "avg.npz"
    assert average.main(["--inputs", str(out), "--best", "1", "--output", str(output)]) == 2
    assert "records a validation metric" in capsys.readouterr().err
    assert average.main(["--inputs", checkpoint.latest(out), "--best", "1", "--output",
                         str(output)]) == 2
    assert "has no recorded validation metric" in capsys.readouterr().err
    assert not output.exists()
    with pytest.raises(SystemExit):               # one way of choosing at a time
        average.main(["--inputs", str(out), "--best", "1", "--last", "2", "--output",
                      str(output)])


def test_rotation_never_deletes_a_kept_best_checkpoint(tmp_path):
    for step in range(1, 8):
        checkpoint.save(checkpoint.checkpoint_path(tmp_path, step), {"w": np.zeros(2)},
                        step=step, config={}, vocab_id=None)
    deleted = checkpoint.keep_last(tmp_path, 2, spare=[1, 4])
    assert steps_on_disk(tmp_path) == [1, 4, 6, 7]
    assert sorted(os.path.basename(p) for p in deleted) == [
        f"checkpoint_{s:08d}.npz" for s in (2, 3, 5)]


# ---- patience ---------------------------------------------------------------------------------

def test_patience_stops_the_run_and_says_so(train_lm, peaking_text, tmp_path, capsys):
    out = tmp_path / "run"
    common = ["--data", str(peaking_text), *LM, "--max-steps", "200", "--best-metric", "loss",
              "--patience", "3", "--out", str(out)]
    assert train_lm.main(common) == 0
    valid = validations(out)
    best = valid[-1]["best_step"]
    assert valid[-1]["step"] == best + 3 * 5 < 200             # three validations after the best
    assert all(r["valid_loss"] >= valid[-1]["best_valid_loss"] for r in valid)
    assert f"stopped at step {best + 15}: no better validation loss in 3 validations" in \
        capsys.readouterr().out
    assert steps_on_disk(out)[-1] == best + 15
    # resumed with the same patience: nothing more to do, and still a success
    assert train_lm.main(common + ["--resume"]) == 0
    assert steps_on_disk(out)[-1] == best + 15 and validations(out) == valid


# ---- resume, bit for bit ----------------------------------------------------------------------

def same_runs(a: Path, b: Path) -> None:
    """Two run directories hold the same checkpoints, records, best and validation lines."""
    assert steps_on_disk(a) == steps_on_disk(b)
    for name in [os.path.basename(p) for _, p in checkpoint.list_checkpoints(a)] + [BEST_NAME]:
        assert_same_checkpoint(checkpoint.load(a / name), checkpoint.load(b / name))
    assert json.loads((a / "run.json").read_text())["best"] == \
        json.loads((b / "run.json").read_text())["best"]
    assert validations(a) == validations(b)


@pytest.mark.parametrize("cut", ["batches", "validation"])
def test_resume_keeps_the_best_the_kept_set_and_the_patience_count(train_lm, peaking_text,
                                                                   tmp_path, monkeypatch, capsys,
                                                                   cut):
    """Ctrl-C while reading the 13th batch (after step 12), or during the third validation
    (step 15: the checkpoint of step 15 is saved without it, and the resumed run makes it
    first): the resumed run ends as the uninterrupted one, file for file."""
    run = ["--data", str(peaking_text), *LM, "--max-steps", "40", "--best-metric", "loss",
           "--keep-best", "2", "--patience", "20"]
    assert train_lm.main(run + ["--out", str(tmp_path / "straight")]) == 0
    target, name, at = ((train_lm.textdata, "random_blocks", 13) if cut == "batches"
                        else (validation, "evaluate", 3))
    original, calls = getattr(target, name), []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == at:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, interrupted)
    stopped = tmp_path / "stopped"
    assert train_lm.main(run + ["--out", str(stopped)]) == 130
    assert f"interrupted at step {12 if cut == 'batches' else 15}" in capsys.readouterr().out
    if cut == "validation":
        cut_short = checkpoint.load(checkpoint.latest(stopped))
        assert cut_short.step == 15 and "valid" not in cut_short.extra
    monkeypatch.setattr(target, name, original)
    assert train_lm.main(run + ["--out", str(stopped), "--resume"]) == 0
    same_runs(tmp_path / "straight", stopped)
    record = checkpoint.load(checkpoint.latest(stopped)).extra["validation"]
    assert record["since_best"] == (40 - record["best_step"]) // 5 > 0
    two_best = sorted(validations(stopped), key=lambda r: (r["valid_loss"], r["step"]))[:2]
    assert record["kept"] == [[r["valid_loss"], r["step"]] for r in two_best]


# ---- budgets and phases in updates and epochs -------------------------------------------------

def wmt(*args) -> int:
    return train_wmt.main([str(a) for a in args])


def wmt_args(data: Path, *, test: bool = False) -> list[str]:
    return (["--trainpref", str(data / "train"), "--validpref", str(data / "val"),
             "--source-lang", "en", "--target-lang", "de"]
            + (["--testpref", str(data / "test")] if test else []))


def losses(out: Path) -> list[float]:
    return [r["loss"] for r in read_log(out) if "loss" in r]


def test_max_epochs_ends_the_run_with_the_last_batch_of_the_last_pass(corpus, tmp_path,
                                                                      capsys):
    out = tmp_path / "two"
    assert wmt(*wmt_args(corpus), *TINY, "--max-steps", 1000, "--max-epochs", 2, "--out",
               out) == 0
    last = checkpoint.load(checkpoint.latest(out))
    per_epoch = last.extra["batches_done"]         # batches of a pass, one per update here
    assert last.extra["epoch"] == 1 and last.step == 2 * per_epoch       # two whole passes
    assert f"2 epochs done at step {last.step}" in capsys.readouterr().out
    half = tmp_path / "half"                     # a fraction: the first update boundary after it
    assert wmt(*wmt_args(corpus), *TINY, "--max-steps", 1000, "--max-epochs", 0.5,
               "--update-freq", 2, "--out", half) == 0
    assert checkpoint.load(checkpoint.latest(half)).step == math.ceil(per_epoch / 2 / 2)
    capped = tmp_path / "capped"                 # --max-steps still ends it first
    assert wmt(*wmt_args(corpus), *TINY, "--max-steps", 3, "--max-epochs", 2, "--out",
               capped) == 0
    assert steps_on_disk(capped) == [3]


def test_max_epochs_of_the_language_model_counts_training_tokens(train_lm, peaking_text,
                                                                 tmp_path):
    out = tmp_path / "run"
    assert train_lm.main(["--data", str(peaking_text), *LM, "--max-epochs", "0.5", "--out",
                          str(out)]) == 0
    # 3,600 training tokens, 8 x 16 per step: half a pass is 14.06 steps, so 15
    assert steps_on_disk(out) == [15]


@pytest.mark.parametrize("start", ["3steps", "0.5epochs"])
def test_dropout_starts_after_a_count_of_updates_or_epochs(corpus, tmp_path, start):
    common = [*wmt_args(corpus), *TINY, "--max-steps", 1000, "--max-epochs", 1,
              "--log-every", 1, "--valid-every", 0]
    assert wmt(*common, "--dropout", 0, "--out", tmp_path / "none") == 0
    assert wmt(*common, "--dropout", 0.3, "--dropout-start", start, "--out",
               tmp_path / "late") == 0
    none, late = losses(tmp_path / "none"), losses(tmp_path / "late")
    first = 3 if start == "3steps" else math.ceil(len(none) / 2)     # updates without dropout
    assert len(none) == len(late) > first
    assert late[:first] == none[:first]
    assert all(a != b for a, b in zip(late[first:], none[first:]))


def test_dropout_start_auto_starts_at_a_flat_validation_and_survives_resume(corpus, tmp_path):
    """A margin of 90 %: the perplexity of the second validation (step 4) cannot improve that
    much on the first's, so dropout starts with update 5; a run resumed at step 4 starts it
    there too."""
    common = [*wmt_args(corpus), *TINY, "--log-every", 1, "--valid-every", 2,
              "--valid-bleu-sentences", 0]
    auto = ["--dropout", 0.3, "--dropout-start", "auto", "--dropout-start-margin", 0.9]
    assert wmt(*common, "--max-steps", 8, "--dropout", 0, "--out", tmp_path / "none") == 0
    assert wmt(*common, "--max-steps", 8, *auto, "--out", tmp_path / "auto") == 0
    none, late = losses(tmp_path / "none"), losses(tmp_path / "auto")
    assert late[:4] == none[:4] and all(a != b for a, b in zip(late[4:], none[4:]))
    valid = [r for r in read_log(tmp_path / "auto") if "valid_ppl" in r]
    assert [r.get("dropout_from") for r in valid] == [None, 5, 5, 5]
    assert checkpoint.load(checkpoint.latest(tmp_path / "auto")).extra["validation"][
        "dropout_from"] == 5
    assert wmt(*common, "--max-steps", 4, *auto, "--out", tmp_path / "resumed") == 0
    assert wmt(*common, "--max-steps", 8, *auto, "--resume", "--out", tmp_path / "resumed") == 0
    assert losses(tmp_path / "resumed") == late


def test_cooldown_over_a_count_of_updates_ignores_the_clock(corpus, tmp_path):
    out = tmp_path / "run"
    assert wmt(*wmt_args(corpus), *TINY, "--max-steps", 10, "--warmup", 2, "--cooldown",
               "4steps", "--log-every", 1, "--out", out) == 0
    lrs = [r["lr"] for r in read_log(out) if "lr" in r]
    paper = optim.LRSchedule(json.loads((out / "run.json").read_text())["config"]["d_model"], 2)
    assert lrs[:6] == pytest.approx([paper(k) for k in range(1, 7)])
    assert lrs[6:] == pytest.approx([paper(k) * (10 - k + 1) / 4 for k in range(7, 11)])
    steps = optim.Cooldown(paper, 10, 0.4, follow_clock=False)
    assert steps(3, time_fraction=0.99) == paper(3)               # the clock does not count
    assert optim.Cooldown(paper, 10, 0.4)(3, time_fraction=0.9) < paper(3)


# ---- translation: BLEU, patience, averaging the best for the test ------------------------------

def test_translation_chooses_by_bleu_stops_on_patience_and_tests_the_best(corpus, tmp_path,
                                                                          capsys):
    out = tmp_path / "run"
    assert wmt(*wmt_args(corpus, test=True), *TINY, "--max-steps", 40, "--valid-every", 2,
               "--best-metric", "bleu", "--patience", 2, "--keep-best", 2, "--average-best", 2,
               "--keep-last", 1, "--out", out) == 0
    printed = capsys.readouterr().out
    valid = [r for r in read_log(out) if "valid_bleu" in r]
    best, best_step, since = -1.0, None, 0
    for line in valid:                            # higher is better; a tie is no improvement
        if line["valid_bleu"] > best:
            best, best_step, since = line["valid_bleu"], line["step"], 0
        else:
            since += 1
        assert (line["best_valid_bleu"], line["best_step"]) == (best, best_step)
    last = valid[-1]["step"]           # the untrained model's BLEU stays 0: no improvement
    assert last < 40 and since == 2 and f"stopped at step {last}: no better validation bleu" \
        in printed
    ranked = sorted(valid, key=lambda r: (-r["valid_bleu"], r["step"]))[:2]
    averaged = checkpoint.load(out / "averaged.npz")
    assert averaged.extra["averaged_from"] == [f"checkpoint_{r['step']:08d}.npz"
                                               for r in sorted(ranked, key=lambda r: r["step"])]
    assert json.loads((out / "averaged.test.bleu.json").read_text())["sentences"] == 20
    assert checkpoint.load(out / BEST_NAME).step == best_step


def test_toy_chooses_by_exact_match(tmp_path):
    out = tmp_path / "run"
    assert train_toy.main(["--max-steps", "20", "--valid-every", "10", "--best-metric", "acc",
                           "--eval-size", "20", "--examples", "0", "--quiet", "--out",
                           str(out)]) == 0
    valid = [r for r in read_log(out) if "valid_acc" in r]
    assert [r["step"] for r in valid] == [10, 20] and all("best_valid_acc" in r for r in valid)
    assert checkpoint.load(out / BEST_NAME).step == valid[-1]["best_step"]


# ---- options that do not fit ------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    (["--keep-best", "2"], "--keep-best ranks validations by --best-metric"),
    (["--best-metric", "loss", "--patience", "2", "--valid-every", "0"], "--patience counts"),
    (["--best-metric", "loss", "--keep-best", "1", "--average-best", "2"], "--keep-best >= 2"),
    (["--average-best", "2"], "--average-best ranks"),
    (["--best-metric", "bleu", "--valid-bleu-sentences", "0"], "--valid-bleu-sentences"),
    (["--dropout-start", "2"], "a fraction in [0, 1), a number of updates"),
    (["--dropout-start", "0steps"], "updates are a whole number >= 1"),
    (["--cooldown", "auto"], "--cooldown"),
    (["--dropout-start", "auto", "--valid-every", "0"], "--dropout-start auto decides"),
])
def test_choosing_options_that_do_not_fit_are_usage_errors(corpus, tmp_path, capsys, options,
                                                           message):
    with pytest.raises(SystemExit) as stopped:
        wmt(*wmt_args(corpus), *TINY, *options, "--out", tmp_path / "run")
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_phase_longer_than_the_run_is_refused_before_training(corpus, tmp_path, capsys):
    assert wmt(*wmt_args(corpus), *TINY, "--max-steps", 5, "--dropout-start", "5steps",
               "--out", tmp_path / "a") == exits.BAD_INPUT
    assert "dropout would never start" in capsys.readouterr().err
    assert wmt(*wmt_args(corpus), *TINY, "--max-steps", 5, "--cooldown", "6steps",
               "--out", tmp_path / "b") == exits.BAD_INPUT
    assert "more than the run's 5" in capsys.readouterr().err


def test_phases_parse_fractions_updates_epochs_and_auto():
    assert phases.parse("0.3") == 0.3 and phases.parse("1200steps") == "1200steps"
    assert phases.parse(" 8 Epochs ") == "8epochs" and phases.parse("2.50epochs") == "2.5epochs"
    assert phases.parse("auto", auto=True) == "auto"
    for bad in ("1", "auto", "1.5steps", "0epochs", "-1steps", "steps", "3 updates"):
        with pytest.raises(ValueError):
            phases.parse(bad)
    assert phases.in_steps("1200steps", 7.5) == 1200 and phases.in_steps("2epochs", 7.5) == 15
    assert phases.in_steps("0.1epochs", 7.5) == 1 and phases.budget_steps(100, 2, 7.5) == 15
    assert phases.budget_steps(10, 2, 7.5) == 10 and phases.budget_steps(10, None, 7.5) == 10


def test_a_record_judges_in_the_metrics_direction_and_ranks_ties_by_step():
    record = validation.Record(metric="valid_bleu")
    outcomes = [record.judge(step, {"valid_bleu": bleu}, keep_best=2)[0]
                for step, bleu in [(1, 3.0), (2, 5.0), (3, 5.0), (4, float("nan")), (5, 4.0)]]
    assert outcomes == [True, True, False, False, False]
    assert (record.best, record.best_step, record.since_best) == (5.0, 2, 3)
    assert record.kept == [[5.0, 2], [5.0, 3]]
    assert validation.Record.from_dict(record.to_dict()) == record
    loss = validation.Record(metric="valid_loss")
    assert [loss.judge(s, {"valid_loss": v}, keep_best=0)[0]
            for s, v in [(1, 2.0), (2, 1.0), (3, 1.5)]] == [True, True, False]
    with pytest.raises(ValueError, match="unknown validation metric"):
        validation.check_metric("valid_cheer")
