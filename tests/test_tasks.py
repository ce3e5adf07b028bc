"""Tests of minitfm.tasks: batch format, symbol ids, answers, reproducibility."""

import itertools

import numpy as np
import pytest

from minitfm import backend, tasks
from minitfm.ids import BOS_ID, EOS_ID


def first_batches(task, n=3, seed=0, **kwargs):
    kwargs = {"vocab": 10, "length": 7, "batch_size": 5, **kwargs}
    factory = tasks.train_batches(task, seed=seed, **kwargs)
    return list(itertools.islice(factory(0), n))


@pytest.mark.parametrize("task", tasks.TASKS)
def test_batch_format(task):
    for src, tgt in first_batches(task, vocab=6, length=7, batch_size=5):
        assert src.shape == (5, 8) and tgt.shape == (5, 9)
        assert src.dtype.kind == "i" and tgt.dtype.kind == "i"
        assert (src[:, -1] == EOS_ID).all()
        assert (tgt[:, 0] == BOS_ID).all() and (tgt[:, -1] == EOS_ID).all()
        for symbols in (src[:, :-1], tgt[:, 1:-1]):
            assert symbols.min() >= tasks.FIRST_SYMBOL
            assert symbols.max() < tasks.model_vocab(6)


def test_answers():
    inputs = np.array([[5, 9, 4, 4, 7], [8, 6, 6, 5, 4]])
    assert tasks.answers("copy", inputs).tolist() == inputs.tolist()
    assert tasks.answers("reverse", inputs).tolist() == [[7, 4, 4, 9, 5], [4, 5, 6, 6, 8]]
    assert tasks.answers("sort", inputs).tolist() == [[4, 4, 5, 7, 9], [4, 5, 6, 6, 8]]


@pytest.mark.parametrize("task", tasks.TASKS)
def test_targets_are_the_answers_of_the_sources(task):
    for src, tgt in first_batches(task):
        assert tgt[:, 1:-1].tolist() == tasks.answers(task, src[:, :-1]).tolist()


@pytest.mark.parametrize("task", tasks.TASKS)
def test_same_seed_same_batches_other_seed_other_batches(task):
    a, b, c = first_batches(task, seed=3), first_batches(task, seed=3), first_batches(task, seed=4)
    for (sa, ta), (sb, tb) in zip(a, b):
        assert np.array_equal(sa, sb) and np.array_equal(ta, tb)
    assert not all(np.array_equal(sa, sc) for (sa, _), (sc, _) in zip(a, c))


def test_batch_depends_only_on_seed_epoch_and_index():
    factory = tasks.train_batches("copy", vocab=10, length=7, batch_size=5, seed=0)
    third = list(itertools.islice(factory(0), 3))[2]
    again = list(itertools.islice(factory(0), 3))[2]
    assert np.array_equal(third[0], again[0])
    assert not np.array_equal(next(iter(factory(0)))[0], next(iter(factory(1)))[0])


def test_held_out_comes_from_another_stream():
    inputs, outputs = tasks.held_out("sort", 5, vocab=10, length=7, seed=0)
    assert inputs.shape == outputs.shape == (5, 7)
    assert np.array_equal(inputs, tasks.held_out("sort", 5, vocab=10, length=7, seed=0)[0])
    train_src = first_batches("sort", n=1, seed=0)[0][0][:, :-1]
    assert not np.array_equal(inputs, train_src)
    rng = backend.host_rng(0, tasks.HELD_OUT_STREAM)
    assert np.array_equal(inputs, tasks.sample("sort", rng, 5, vocab=10, length=7)[0])


def test_exact_match():
    outputs = np.array([[4, 5], [6, 7], [8, 9], [4, 4]])
    assert tasks.exact_match([[4, 5], [6, 7], [8], [4, 4, 4]], outputs) == 0.5
    with pytest.raises(ValueError, match="2 hypotheses for 4"):
        tasks.exact_match([[4, 5], [6, 7]], outputs)


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(ValueError, match="unknown task 'rotate'"):
        tasks.train_batches("rotate", vocab=10, length=5, batch_size=2, seed=0)
    with pytest.raises(ValueError, match="at least 2 symbols"):
        tasks.held_out("copy", 3, vocab=1, length=5, seed=0)
