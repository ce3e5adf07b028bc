"""Dropout's compiled draw (CPU): NumPy's PCG64 numbers computed by a compiled loop in parts on
the worker's threads, held to ``random_raw`` number for number, and the masks they make to the
masks of the plain draw, bit for bit."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitfm import backend
from minitfm.speed import rows
from minitfm.layers import dropout, residual
from minitfm.speed import dropout as fast_dropout


@pytest.fixture(autouse=True)
def on_numpy(numpy_backend):
    yield
    rows.use(False, 1)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2 ** 63), skip=st.integers(0, 2 ** 70), n=st.integers(0, 70_000),
       threads=st.integers(1, 3))
def test_compiled_numbers_are_random_raws_numbers(seed, skip, n, threads):
    """From any place of any stream, on any thread count: the same numbers, and the generator
    left where random_raw leaves it."""
    rows.use(True, threads, compiled=True)
    ours, theirs = np.random.PCG64(seed), np.random.PCG64(seed)
    ours.advance(skip)
    theirs.advance(skip)
    got = fast_dropout.pcg64_numbers(ours, n)
    assert got.dtype == np.uint64
    np.testing.assert_array_equal(got, theirs.random_raw(n))
    assert ours.state == theirs.state


@pytest.mark.parametrize("shape", [(128, 24, 256), (7, 4), (3, 1000, 44), (5, 3)])
def test_masks_drawn_by_the_compiled_loop_are_the_plain_masks(shape):
    """``keep_mask`` with the compiled loops against ``backend.dropout_keep`` (random_raw, or the
    generator's bytes where the size is no multiple of 4), mask after mask from one generator."""
    rows.use(True, 2, compiled=True)
    ours, theirs = backend.rng(3, 1), backend.rng(3, 1)
    for p in (0.1, 0.3):
        keep, scale = fast_dropout.loops_keep_mask(ours, shape, p)
        expected, expected_scale = backend.dropout_keep(theirs, shape, p)
        np.testing.assert_array_equal(keep, expected)
        assert scale == expected_scale and keep.shape == shape
    assert ours.random() == theirs.random()


def test_the_row_passes_draw_their_masks_with_the_compiled_loop(monkeypatch):
    numbers = []
    real = fast_dropout.pcg64_numbers
    monkeypatch.setattr(fast_dropout, "pcg64_numbers",
                        lambda bits, n: numbers.append(n) or real(bits, n))
    x, f = (np.ones((64, 32), np.float32) for _ in range(2))
    rows.use(True, 2, compiled=True)
    ln = {"gamma": np.ones(32, np.float32), "beta": np.zeros(32, np.float32)}
    residual.forward(x, lambda h: (f.copy(), None), ln, 0.1, backend.rng(0, 1), pre_ln=False)
    dropout.forward(x, 0.1, backend.rng(0, 2))
    rows.use(False, 1)
    dropout.forward(x, 0.1, backend.rng(0, 2))
    assert numbers == [64 * 32 // 4] * 2
