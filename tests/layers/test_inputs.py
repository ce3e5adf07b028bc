"""The input layer's word dropout: whole tokens dropped, their positions kept, their gradient
masked; nothing drawn or dropped where it is off."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitfm import backend
from minitfm.gradcheck.cases import CASES
from minitfm.gradcheck.check import TOLERANCE, check_case
from minitfm.layers import inputs


def _layer(seed, b=3, t=7, v=9, d=4):
    rng = np.random.default_rng(seed)
    return rng.integers(0, v, size=(b, t)), {"table": rng.standard_normal((v, d))}


@pytest.mark.parametrize("p_word", [0.25, 0.5])
def test_word_dropout_drops_whole_tokens_and_keeps_their_positions(p_word):
    ids, params = _layer(1)
    plain, _ = inputs.forward(ids, params)
    words = params["table"][ids] * 2.0                          # sqrt(d_model), d_model 4
    y, cache = inputs.forward(ids, params, rng=backend.rng(4), p_word=p_word)
    dropped = np.all(np.isclose(y, plain - words), axis=-1)     # the position alone
    kept = np.all(np.isclose(y, plain - words + words / (1 - p_word)), axis=-1)
    assert np.all(dropped ^ kept), "each token is either dropped whole or kept, scaled"
    assert dropped.any() and kept.any()
    np.testing.assert_array_equal(cache.words.keep[..., 0], kept)


def test_word_dropout_drops_its_share_of_tokens():
    ids = np.ones((200, 100), dtype=np.int64)
    params = {"table": np.ones((2, 4))}
    _, cache = inputs.forward(ids, params, rng=backend.rng(9), p_word=0.2)
    assert cache.words.keep.shape == (200, 100, 1)
    assert abs(1 - cache.words.keep.mean() - 0.2) < 0.01         # 20,000 draws: sd 0.003


def test_without_word_dropout_nothing_is_drawn_for_it():
    """p_word 0 draws no word mask, so a run's other masks are those of a run without it; in
    evaluation (no generator) word dropout is off."""
    ids, params = _layer(2)
    y0, c0 = inputs.forward(ids, params, 0.3, backend.rng(5))
    y1, c1 = inputs.forward(ids, params, 0.3, backend.rng(5), p_word=0.0)
    np.testing.assert_array_equal(y0, y1)
    assert c1.words is None
    y2, c2 = inputs.forward(ids, params, 0.3, None, p_word=0.5)
    np.testing.assert_array_equal(y2, inputs.forward(ids, params)[0])
    assert c2.words is None and c2.dropout is None


def test_a_dropped_token_gets_no_gradient():
    ids = np.array([[1, 2, 3, 4, 5, 6]])
    params = {"table": np.random.default_rng(0).standard_normal((7, 4))}
    _, cache = inputs.forward(ids, params, rng=backend.rng(11), p_word=0.5)
    _, grads = inputs.backward(np.ones((1, 6, 4)), cache)
    kept = cache.words.keep[0, :, 0]
    assert kept.any() and not kept.all()
    assert not grads["table"][ids[0][~kept]].any()
    np.testing.assert_allclose(grads["table"][ids[0][kept]], 2.0 / (1 - 0.5))   # sqrt(d) * scale


@settings(max_examples=10)
@given(b=st.integers(1, 3), t=st.integers(1, 6), d=st.integers(1, 5),
       seed=st.integers(0, 2**31 - 1))
def test_word_dropout_gradient_matches_finite_differences(b, t, d, seed):
    (case,) = [c for c in CASES if c.name.startswith("inputs (word dropout")]
    errors = check_case(case, seed, dict(b=b, t=t, v=6, d=d))
    assert set(errors) == {"table"}
    assert max(errors.values()) <= TOLERANCE
