"""Tests of the training loop and its run (minitfm/training/): accumulation, exact resume, Ctrl-C,
divergence, the log, rotation and refusing checkpoints of another run. A tiny model and a few
steps keep each test well under a second."""

import json
import os

import numpy as np
import pytest

from minitfm import backend, checkpoint, tasks
from minitfm.checkpoint import CheckpointError
from minitfm.ids import PAD_ID
from minitfm.models import translator
from minitfm.models.translator import Config
from minitfm.optim import LRSchedule, WarmupDecaySchedule
from minitfm.training import loop, phases
from minitfm.training.divergence import TrainingDiverged
from minitfm.training.plan import plan
from minitfm.training.rundir import LOG_NAME
from minitfm.training.state import TrainOptions, TrainState
from minitfm.training.validation import evaluate
from tests import trainrun

VOCAB = 7                                   # symbols; the model sees ids 0 .. 10
CFG = Config.preset("tiny", src_vocab=tasks.model_vocab(VOCAB), tgt_vocab=tasks.model_vocab(VOCAB),
                    dropout=0.1)


def ragged_batch(seed: int, n: int = 4, length: int = 6):
    """A copy batch whose sequences have different lengths, padded with PAD."""
    rng = backend.host_rng(seed)
    src = np.full((n, length + 1), PAD_ID, dtype=np.int64)
    tgt = np.full((n, length + 2), PAD_ID, dtype=np.int64)
    for i, size in enumerate(rng.integers(1, length + 1, size=n)):
        s, t = tasks.to_batch(*tasks.sample("copy", rng, 1, vocab=VOCAB, length=int(size)))
        src[i, :s.shape[1]], tgt[i, :t.shape[1]] = s[0], t[0]
    return src, tgt


def epoch_batches(epoch: int):
    """Five ragged batches per epoch, in an order fixed by the epoch."""
    order = backend.host_rng(0, epoch).permutation(5)
    return [ragged_batch(int(i)) for i in order]


def options(tmp_path=None, **overrides) -> TrainOptions:
    kwargs = dict(max_steps=6, out_dir=str(tmp_path) if tmp_path else None, lr_factor=2.0,
                  warmup=3, log_every=1, progress=False)
    return TrainOptions(**{**kwargs, **overrides})


def train(cfg, batches, options: TrainOptions, **start):
    """A run of the toy vocabulary (``start``: Run.start's arguments)."""
    return trainrun.train(cfg, batches, options, **{"vocab_id": "toy-7", **start})


def read_log(directory):
    with open(os.path.join(directory, LOG_NAME)) as f:
        return [json.loads(line) for line in f]


def steps_saved(directory):
    return [step for step, _ in checkpoint.list_checkpoints(directory)]


def assert_same_arrays(a: dict, b: dict):
    assert a.keys() == b.keys()
    for name in a:
        assert np.array_equal(backend.to_host(a[name]), backend.to_host(b[name])), name


# ---- accumulation -------------------------------------------------------------------------

def test_accumulated_batches_equal_one_big_batch(tmp_path):
    cfg = CFG.replace(dropout=0.0)
    small = [ragged_batch(1, n=3), ragged_batch(2, n=5, length=4)]     # different token counts
    width = [max(b[i].shape[1] for b in small) for i in (0, 1)]
    big = tuple(np.concatenate([np.pad(b[i], ((0, 0), (0, width[i] - b[i].shape[1])))
                                for b in small]) for i in (0, 1))
    params = translator.init_params(cfg, seed=0)
    state = TrainState(params=params, optimizer=None, seed=0)
    stats, grads = loop.accumulate(state, cfg, small, step=1, seed=0)
    expected_stats, expected = translator.loss_and_grads(params, cfg, *big)
    assert stats["tokens"] == expected_stats["tokens"]
    assert stats["loss"] == pytest.approx(expected_stats["loss"], rel=1e-5)
    for name, value in grads.items():
        np.testing.assert_allclose(value, expected[name], rtol=1e-4, atol=1e-6, err_msg=name)

    # and through train(): the same losses, step by step
    train(cfg, small, options(tmp_path / "accumulated", max_steps=3, update_freq=2))
    train(cfg, [big], options(tmp_path / "big", max_steps=3))
    for a, b in zip(read_log(tmp_path / "accumulated"), read_log(tmp_path / "big")):
        assert a["tokens"] == b["tokens"] and a["loss"] == pytest.approx(b["loss"], rel=1e-4)


# ---- resume -------------------------------------------------------------------------------

def test_resume_is_bit_identical(tmp_path):
    straight = train(CFG, epoch_batches, options(tmp_path / "straight", update_freq=2))
    # 3 steps of 2 batches end one batch into epoch 1: the resumed run must skip exactly that
    first = train(CFG, epoch_batches, options(tmp_path / "split", max_steps=3, update_freq=2))
    assert (first.step, first.epoch, first.batches_done) == (3, 1, 1)
    resumed = train(CFG, epoch_batches,
                          options(tmp_path / "split", update_freq=2, resume=True))
    assert resumed.step == straight.step == 6
    assert_same_arrays(resumed.params, straight.params)
    assert_same_arrays(resumed.optimizer.m, straight.optimizer.m)
    assert_same_arrays(resumed.optimizer.v, straight.optimizer.v)
    assert [r["step"] for r in read_log(tmp_path / "split")] == [1, 2, 3, 4, 5, 6]


def test_resume_drops_log_lines_after_the_checkpoint(tmp_path):
    train(CFG, epoch_batches, options(tmp_path, max_steps=2))
    with open(tmp_path / LOG_NAME, "a") as f:        # steps a crashed session had logged
        f.write(json.dumps({"step": 3, "loss": 9.0}) + "\n" + '{"step": 4, "lo')   # cut short
    train(CFG, epoch_batches, options(tmp_path, max_steps=4, resume=True))
    assert [r["step"] for r in read_log(tmp_path)] == [1, 2, 3, 4]
    assert read_log(tmp_path)[2]["loss"] != 9.0


def test_resume_without_a_checkpoint_starts_from_scratch(tmp_path):
    resumed = train(CFG, epoch_batches, options(tmp_path, max_steps=2, resume=True))
    assert_same_arrays(resumed.params, train(CFG, epoch_batches, options(max_steps=2)).params)


def test_resume_of_a_finished_run_does_nothing(tmp_path):
    done = train(CFG, epoch_batches, options(tmp_path, max_steps=2))
    again = train(CFG, epoch_batches, options(tmp_path, max_steps=2, resume=True))
    assert again.step == 2 and not again.valid
    assert_same_arrays(again.params, done.params)


# ---- Ctrl-C -------------------------------------------------------------------------------

def test_ctrl_c_in_the_batches_saves_and_resumes_exactly(tmp_path):
    def interrupted_at_batch_4(epoch):
        for i, batch in enumerate(epoch_batches(epoch)):
            if i == 3:
                raise KeyboardInterrupt
            yield batch

    state = train(CFG, interrupted_at_batch_4, options(tmp_path / "run"))
    assert state.interrupted and state.step == 3
    assert steps_saved(tmp_path / "run") == [3]
    resumed = train(CFG, epoch_batches, options(tmp_path / "run", resume=True))
    straight = train(CFG, epoch_batches, options(tmp_path / "straight"))
    assert_same_arrays(resumed.params, straight.params)


def test_ctrl_c_in_a_callback_saves_the_completed_step(tmp_path):
    def metric(params, cfg):
        raise KeyboardInterrupt

    state = train(CFG, epoch_batches, options(tmp_path, valid_every=2), valid_metric=metric)
    assert state.interrupted and state.step == 2
    assert steps_saved(tmp_path) == [2]
    assert checkpoint.load(state.last_checkpoint).step == 2


# ---- divergence ---------------------------------------------------------------------------

def poison_at(step: int):
    """A validation callback (validating every step) that puts a NaN into the parameters at
    ``step``."""
    calls = []

    def metric(params, cfg):
        calls.append(step)
        if len(calls) == step:
            params["emb"][5, 0] = np.nan
        return {}
    return metric


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    with pytest.raises(TrainingDiverged, match="loss is nan at step 4") as error:
        train(CFG, epoch_batches, options(tmp_path, save_every=2, valid_every=1),
                    valid_metric=poison_at(3))
    assert steps_saved(tmp_path) == [2]
    assert "checkpoint_00000002.npz, is intact" in str(error.value)
    good = checkpoint.load(checkpoint.latest(tmp_path))
    assert all(np.isfinite(a).all() for a in good.params.values())


def test_non_finite_parameters_are_never_saved(tmp_path):
    with pytest.raises(TrainingDiverged, match="'emb' holds NaN or Inf at step 2"):
        train(CFG, epoch_batches, options(tmp_path, save_every=1, valid_every=1),
                    valid_metric=poison_at(2))
    assert steps_saved(tmp_path) == [1, 2]     # step 2's, saved before its validation poisoned it
    for _, path in checkpoint.list_checkpoints(tmp_path):
        assert all(np.isfinite(a).all() for a in checkpoint.load(path).params.values())


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_huge_learning_rate_is_reported_with_its_step():
    with pytest.raises(TrainingDiverged, match=r"at step \d+; training stopped"):
        train(CFG, epoch_batches, options(max_steps=20, lr_factor=1e36, warmup=1))


# ---- log, validation, rotation ------------------------------------------------------------

def test_log_lines(tmp_path):
    valid = [ragged_batch(7), ragged_batch(8)]
    state = train(CFG, epoch_batches, options(tmp_path, log_every=2, valid_every=3,
                                                    clip_norm=1.0),
                        valid_batches=valid, valid_metric=lambda p, c: {"valid_acc": 0.25})
    lines = read_log(tmp_path)
    assert [r["step"] for r in lines] == [2, 3, 4, 6, 6]
    steps = [r for r in lines if "loss" in r]
    schedule = LRSchedule(CFG.d_model, warmup=3, factor=2.0)
    for r in steps:
        assert set(r) == {"step", "loss", "nll", "lr", "tokens", "tokens_per_s", "elapsed",
                          "grad_norm"}
        assert r["lr"] == schedule(r["step"]) and np.isfinite(r["loss"]) and r["tokens_per_s"] > 0
    assert steps[0]["tokens"] < steps[1]["tokens"] < steps[2]["tokens"] == state.tokens
    validations = [r for r in lines if "valid_loss" in r]
    assert set(validations[0]) == {"step", "valid_loss", "valid_nll", "valid_ppl", "valid_acc"}
    assert validations[-1]["valid_ppl"] == pytest.approx(np.exp(validations[-1]["valid_nll"]))
    assert state.valid == validations[-1]
    assert state.valid == {"step": 6, **evaluate(state.params, CFG, valid),
                           "valid_acc": 0.25}


def test_keeps_the_last_k_checkpoints(tmp_path):
    state = train(CFG, epoch_batches, options(tmp_path, max_steps=5, save_every=1, keep_last=2))
    assert steps_saved(tmp_path) == [4, 5]
    assert state.last_checkpoint == checkpoint.checkpoint_path(tmp_path, 5)


def test_checkpoint_contents(tmp_path):
    state = train(CFG, epoch_batches, options(tmp_path, max_steps=2, seed=3),
                  vocab_model=b"model bytes", run_meta={"task": "copy"})
    saved = checkpoint.load(state.last_checkpoint)
    assert saved.step == saved.optimizer_state["step"] == 2
    assert saved.config == CFG.to_dict() and saved.vocab_id == "toy-7"
    assert saved.vocab_model == b"model bytes"
    assert saved.extra["seed"] == 3 and saved.extra["run_meta"] == {"task": "copy"}
    assert_same_arrays(saved.params, state.params)


# ---- refusing what does not fit -----------------------------------------------------------

@pytest.fixture
def finished_run(tmp_path):
    train(CFG, epoch_batches, options(tmp_path, max_steps=2), run_meta={"task": "copy"})
    return tmp_path


@pytest.mark.parametrize("cfg, overrides, start, message", [
    (CFG.replace(d_model=12, n_heads=2), {}, {}, "config field 'd_model': checkpoint has 8"),
    (CFG, {}, {"vocab_id": "spm-8k"}, "vocabulary differs"),
    (CFG, {"seed": 1}, {}, "--seed: the run has 0, now 1"),
    (CFG, {}, {"run_meta": {"task": "sort"}}, "'task': checkpoint has 'copy'"),
])
def test_resume_refuses_another_run(finished_run, cfg, overrides, start, message):
    with pytest.raises(CheckpointError, match=message):
        train(cfg, epoch_batches, options(finished_run, max_steps=4, resume=True, **overrides),
              **{"run_meta": {"task": "copy"}, **start})


def test_resume_refuses_a_truncated_checkpoint(finished_run):
    path = checkpoint.latest(finished_run)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(CheckpointError, match="damaged"):
        train(CFG, epoch_batches, options(finished_run, max_steps=4, resume=True),
              run_meta={"task": "copy"})


def test_a_new_run_refuses_a_directory_with_checkpoints(finished_run):
    with pytest.raises(FileExistsError, match="continue it with --resume"):
        train(CFG, epoch_batches, options(finished_run, max_steps=4))


def test_bad_options_and_empty_batches_are_explained():
    with pytest.raises(ValueError, match="resume needs out_dir"):
        train(CFG, epoch_batches, options(resume=True))
    with pytest.raises(ValueError, match="batches of epoch 1 are empty"):
        train(CFG, iter([ragged_batch(0)]), options(max_steps=2))


# ---- time limit ---------------------------------------------------------------------------

def test_time_limit_stops_after_the_update_that_exhausts_it(tmp_path, monkeypatch):
    """A fake clock advancing 1 s per reading: the limit of 2.5 s is spent within a few updates."""
    clock = iter(range(10**6))
    monkeypatch.setattr(loop.time, "perf_counter", lambda: float(next(clock)))
    state = train(CFG, epoch_batches, options(tmp_path, max_steps=100, time_limit=2.5))
    assert state.out_of_time and not state.interrupted
    assert 1 <= state.step < 100
    assert steps_saved(tmp_path) == [state.step]            # a checkpoint of the last update
    assert state.elapsed >= 2.5


def test_a_decay_schedule_ends_with_the_time_limit(tmp_path, monkeypatch):
    """The fake clock of the test above: a linear decay meant for 100 steps follows the clock
    instead, and its rates are the schedule's at each update's share of the time spent."""
    clock = iter(range(10**6))
    monkeypatch.setattr(loop.time, "perf_counter", lambda: float(next(clock)))
    schedule = WarmupDecaySchedule(peak_lr=1e-3, warmup=1, total_steps=100, decay="linear")
    state = train(CFG, epoch_batches, options(tmp_path, max_steps=100, time_limit=12.0,
                                              schedule="linear", lr=1e-3, warmup=1))
    lines = [r for r in read_log(tmp_path) if "lr" in r]
    assert state.out_of_time and len(lines) == state.step >= 3
    for before, r in zip([0.0] + [r["elapsed"] for r in lines], lines):
        assert r["lr"] == schedule(r["step"], time_fraction=before / 12.0)
    assert lines[-1]["lr"] < schedule(state.step)            # further down than the steps say
    assert all(a["lr"] > b["lr"] for a, b in zip(lines[1:], lines[2:]))


@pytest.mark.parametrize("dropouts", [dict(dropout=0.1),
                                      dict(dropout=0.0, attention_dropout=0.2),
                                      dict(dropout=0.0, relu_dropout=0.2)])
def test_late_dropout_is_off_for_the_first_part_of_the_run(tmp_path, dropouts):
    """dropout_start=0.5 of 6 steps: steps 1-3 are those of a run without dropout, from step 4
    on dropout is on (and the masks are those of steps 4-6, as in any run with dropout); so for
    each kind of dropout."""
    cfg = CFG.replace(**dropouts)
    train(cfg, epoch_batches, options(tmp_path / "late", dropout_start=0.5))
    train(CFG.replace(dropout=0.0), epoch_batches, options(tmp_path / "none"))
    train(cfg, epoch_batches, options(tmp_path / "always"))
    late, none, always = (read_log(tmp_path / name) for name in ("late", "none", "always"))
    assert [r["loss"] for r in late[:3]] == [r["loss"] for r in none[:3]]
    assert late[0]["loss"] != always[0]["loss"]
    assert all(a["loss"] != b["loss"] for a, b in zip(late[3:6], none[3:6]))


def test_on_dropout_start_is_called_once_before_the_first_batches_with_dropout(tmp_path):
    """Steps 1-3 without dropout: the call comes after 3 batches were read, before the 4th; a run
    resumed after that point calls it before reading anything; without late dropout, at once."""
    def run(directory, **overrides):
        reads, calls = [], []

        def batches(epoch):
            for batch in epoch_batches(epoch):
                reads.append(batch)
                yield batch
        train(CFG, batches, options(directory, **overrides),
              on_dropout_start=lambda: calls.append(len(reads)))
        return calls

    assert run(tmp_path / "late", dropout_start=0.5) == [3]
    assert run(tmp_path / "late", dropout_start=0.5, max_steps=8, resume=True) == [0]
    assert run(tmp_path / "early", max_steps=2) == [0]
    # from step 8 (3 batches into epoch 1, skipped on resume), dropout from step 12 of 12 (the
    # first with 11 of 12 steps behind it)
    assert run(tmp_path / "late", dropout_start=0.9, max_steps=12, resume=True) == [3 + 3]


def test_late_dropout_follows_the_steps_or_the_clock_whichever_is_further():
    late = plan(options(max_steps=100, dropout_start=0.5), CFG.d_model)
    assert late.dropout_off(50, 0.0, None) and not late.dropout_off(51, 0.0, None)
    assert late.dropout_off(10, 0.49, None) and not late.dropout_off(10, 0.5, None)
    from_start = plan(options(max_steps=100), CFG.d_model)       # 0: dropout from the start
    assert not from_start.dropout_off(1, 0.0, None)
    with pytest.raises(ValueError, match=r"must be a fraction in \[0, 1\)"):
        phases.parse("1.0")


def test_late_dropout_in_updates_or_epochs_becomes_a_step():
    """1200steps is update 1200 on any machine; 2.5epochs of 40 updates each is update 100."""
    assert plan(options(max_steps=2000, dropout_start="1200steps"), 8).dropout_start_step == 1200
    assert plan(options(max_steps=2000, dropout_start="2.5epochs"), 8,
                epoch_updates=40.0).dropout_start_step == 100
    with pytest.raises(ValueError, match="dropout would never start"):
        plan(options(max_steps=100, dropout_start="100steps"), 8)
    with pytest.raises(ValueError, match="has none: give updates"):
        plan(options(max_steps=100, dropout_start="2epochs"), 8)
