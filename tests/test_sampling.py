"""Tests of minitfm.decoding.sampling: each filter against its definition, the draw against the filtered
distribution (chi-square, fixed seed), reproducibility, the greedy limit and argument errors."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minitfm import backend
from minitfm.decoding.sampling import (NonFiniteLogits, apply_temperature, draw, draw_next, filter_logits,
                              greedy, probabilities, sample, top_k_filter, top_p_filter)

pytestmark = pytest.mark.usefixtures("numpy_backend")

logit_rows = hnp.arrays(np.float64, st.tuples(st.integers(1, 4), st.integers(1, 12)),
                        elements=st.floats(-8, 8))


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# chi-square critical values at the 0.999 quantile, by degrees of freedom
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12,
            9: 27.88}


def chi_square(counts, expected_probabilities):
    """Pearson's statistic over the tokens of non-zero expected probability."""
    n = counts.sum()
    support = expected_probabilities > 0
    expected = n * expected_probabilities[support]
    return float(((counts[support] - expected) ** 2 / expected).sum()), int(support.sum()) - 1


# --- temperature and softmax -------------------------------------------------------------------

def test_temperature_divides_and_keeps_the_input():
    z = np.array([[1.0, -2.0, 0.5]], dtype=np.float32)
    scaled = apply_temperature(z, 0.5)
    np.testing.assert_array_equal(scaled, [[2.0, -4.0, 1.0]])
    assert scaled.dtype == np.float32
    np.testing.assert_array_equal(z, [[1.0, -2.0, 0.5]])


def test_probabilities_are_a_stable_softmax():
    z = np.array([[1000.0, 1000.0, -np.inf], [0.0, np.log(3.0), -1e300]])
    np.testing.assert_allclose(probabilities(z), [[0.5, 0.5, 0.0], [0.25, 0.75, 0.0]],
                               rtol=1e-15)
    assert probabilities(z[:1].astype(np.float32)).dtype == np.float64


# --- top-k -------------------------------------------------------------------------------------

@settings(max_examples=60)
@given(z=logit_rows, data=st.data())
def test_top_k_keeps_exactly_the_k_largest(z, data):
    k = data.draw(st.integers(1, z.shape[1]))
    out = top_k_filter(z, k)
    kept = np.isfinite(out)
    assert (kept.sum(axis=1) == k).all()
    np.testing.assert_array_equal(out[kept], z[kept])            # kept logits are unchanged
    assert (out[~kept] == -np.inf).all()
    for row, keep in zip(z, kept):
        if not keep.all():
            assert row[keep].min() >= row[~keep].max()           # no dropped one is larger


def test_top_k_breaks_ties_towards_lower_ids():
    z = np.array([[1.0, 3.0, 3.0, 3.0, 0.0]])
    out = top_k_filter(z, 2)
    np.testing.assert_array_equal(out, [[-np.inf, 3.0, 3.0, -np.inf, -np.inf]])
    np.testing.assert_array_equal(top_k_filter(z, 5), z)


# --- top-p -------------------------------------------------------------------------------------

@settings(max_examples=80)
@given(z=logit_rows, p=st.floats(1e-6, 1.0))
def test_top_p_keeps_the_smallest_most_likely_set_reaching_p(z, p):
    out = top_p_filter(z, p)
    q = softmax(z)
    kept = np.isfinite(out)
    np.testing.assert_array_equal(out[kept], z[kept])
    for row_q, keep in zip(q, kept):
        assert keep.sum() >= 1
        mass = row_q[keep].sum()
        assert mass >= p - 1e-12                                  # reaches p ...
        assert mass - row_q[keep].min() < p + 1e-12               # ... and one fewer would not
        if not keep.all():
            assert row_q[keep].min() >= row_q[~keep].max()        # the most likely ones


def test_top_p_by_hand():
    q = np.array([0.5, 0.05, 0.3, 0.15])
    z = np.log(q)[None, :]
    kept = lambda p: np.flatnonzero(np.isfinite(top_p_filter(z, p))).tolist()
    assert kept(0.49) == [0]              # the top token alone has mass 0.5
    assert kept(0.51) == [0, 2]
    assert kept(0.79) == [0, 2]           # 0.5 + 0.3
    assert kept(0.81) == [0, 2, 3]
    assert kept(0.96) == [0, 1, 2, 3]
    assert kept(1e-9) == [0]              # always at least one token
    np.testing.assert_array_equal(top_p_filter(z, 1.0), z)


def test_top_p_breaks_ties_towards_lower_ids():
    z = np.zeros((1, 4))                  # four tokens of 0.25
    np.testing.assert_array_equal(np.isfinite(top_p_filter(z, 0.5)), [[True, True, False, False]])


# --- the draw ----------------------------------------------------------------------------------

def test_draw_is_reproducible_from_the_seed():
    z = np.random.default_rng(0).standard_normal((50, 30))
    a = draw(z, backend.rng(7, 3))
    assert a.shape == (50,) and a.dtype == np.int64
    np.testing.assert_array_equal(draw(z, backend.rng(7, 3)), a)
    assert not np.array_equal(draw(z, backend.rng(7, 4)), a)
    assert not np.array_equal(draw(z, backend.rng(8, 3)), a)


def test_draw_frequencies_match_the_softmax():
    z = np.array([1.0, 0.0, -1.0, 2.0, 0.5, -3.0, 1.5])
    n = 40_000
    ids = draw(np.tile(z, (n, 1)), backend.rng(0))
    counts = np.bincount(ids, minlength=len(z))
    stat, dof = chi_square(counts, softmax(z))
    assert stat < CHI2_999[dof]
    wrong, _ = chi_square(counts, np.full(len(z), 1 / len(z)))   # the test can tell a wrong one
    assert wrong > 100 * CHI2_999[dof]


def test_draw_never_picks_a_zero_probability_token():
    z = np.array([[-np.inf, 0.0, -np.inf, 0.0, -np.inf]] * 5000)
    ids = draw(z, backend.rng(1))
    assert set(ids.tolist()) == {1, 3}


def test_sample_frequencies_match_the_filtered_distribution():
    z = np.array([2.0, 1.0, 0.5, 0.0, -0.5, 1.5, -1.0, 0.2, 3.0, -2.0])
    temperature, top_k, top_p = 0.8, 6, 0.85
    # the filtered distribution by hand: scale, keep the 6 largest, then the nucleus of those
    scaled = z / temperature
    top6 = np.argsort(-scaled)[:6]
    q6 = softmax(scaled[top6])
    order = np.argsort(-q6)
    mass_before = np.cumsum(q6[order]) - q6[order]
    nucleus = top6[order[mass_before < top_p]]
    expected = np.zeros(len(z))
    expected[nucleus] = softmax(scaled[nucleus])
    assert 2 <= len(nucleus) < 6                     # both filters cut something here

    n = 40_000
    logits = np.tile(z, (n, 1)).astype(np.float32)
    np.testing.assert_allclose(probabilities(filter_logits(logits[:1], temperature=temperature,
                                                           top_k=top_k, top_p=top_p))[0],
                               expected, rtol=1e-6, atol=1e-12)
    ids = sample(logits, backend.rng(11), temperature=temperature, top_k=top_k, top_p=top_p)
    counts = np.bincount(ids, minlength=len(z))
    assert set(np.flatnonzero(counts)) == set(nucleus.tolist())
    stat, dof = chi_square(counts, expected)
    assert stat < CHI2_999[dof]
    unfiltered, _ = chi_square(counts, softmax(scaled))
    assert unfiltered > 100 * CHI2_999[dof]


def test_small_temperature_samples_the_greedy_token():
    rng = np.random.default_rng(3)
    z = rng.standard_normal((200, 50)).astype(np.float32)
    best = greedy(z)
    np.testing.assert_array_equal(best, np.argmax(z, axis=1))
    ordered = np.sort(z, axis=1)
    assert (ordered[:, -1] - ordered[:, -2]).min() > 1e-4           # distinct maxima
    np.testing.assert_array_equal(sample(z, backend.rng(0), temperature=1e-7), best)
    np.testing.assert_array_equal(sample(z, backend.rng(0), top_k=1), best)
    np.testing.assert_array_equal(sample(z, backend.rng(0), top_p=1e-9), best)
    assert not np.array_equal(sample(z, backend.rng(0)), best)


def test_sampling_leaves_its_input_alone():
    z = np.random.default_rng(0).standard_normal((3, 9)).astype(np.float32)
    before = z.copy()
    sample(z, backend.rng(0), temperature=0.7, top_k=4, top_p=0.5)
    top_k_filter(z, 2)
    top_p_filter(z, 0.3)
    np.testing.assert_array_equal(z, before)


# --- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, message", [
    (dict(temperature=0.0), ValueError, "temperature must be finite and > 0"),
    (dict(temperature=-1.0), ValueError, "temperature must be finite and > 0"),
    (dict(temperature=math.inf), ValueError, "temperature must be finite and > 0"),
    (dict(temperature=math.nan), ValueError, "temperature must be finite and > 0"),
    (dict(temperature="hot"), TypeError, "temperature must be a number"),
    (dict(top_k=0), ValueError, r"top_k must be between 1 and the vocabulary size 5, got 0"),
    (dict(top_k=6), ValueError, r"top_k must be between 1 and the vocabulary size 5, got 6"),
    (dict(top_k=2.0), TypeError, "top_k must be an integer"),
    (dict(top_k=True), TypeError, "top_k must be an integer"),
    (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.01), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=math.nan), ValueError, r"top_p must be in \(0, 1\]"),
])
def test_bad_settings_are_refused(kwargs, error, message):
    with pytest.raises(error, match=message):
        sample(np.zeros((2, 5)), backend.rng(0), **kwargs)


@pytest.mark.parametrize("logits, error, message", [
    (np.zeros(5), ValueError, "must be a 2-D"),
    (np.zeros((0, 5)), ValueError, "at least one row"),
    (np.zeros((2, 5), dtype=np.int64), TypeError, "floating point"),
    (np.array([[0.0, np.nan]]), ValueError, "NaN"),
    (np.array([[0.0, np.inf]]), ValueError, "NaN or \\+inf"),
    (np.array([[0.0, 1.0], [-np.inf, -np.inf]]), ValueError, "every entry is -inf"),
])
def test_bad_logits_are_refused(logits, error, message):
    for call in (lambda: sample(logits, backend.rng(0)), lambda: greedy(logits),
                 lambda: top_k_filter(logits, 1), lambda: top_p_filter(logits, 0.5)):
        with pytest.raises(error, match=message):
            call()


# --- on the GPU --------------------------------------------------------------------------------

@pytest.mark.gpu
def test_cupy_filters_match_numpy_and_draws_follow_the_distribution(cupy_backend):
    z = np.random.default_rng(0).standard_normal((4, 40))
    device = backend.to_device(z)
    backend.use("numpy")
    expected_k, expected_p = top_k_filter(z, 7), top_p_filter(z, 0.6)
    backend.use("cupy")
    np.testing.assert_array_equal(backend.to_host(top_k_filter(device, 7)), expected_k)
    np.testing.assert_array_equal(backend.to_host(top_p_filter(device, 0.6)), expected_p)
    row = np.array([1.0, 0.0, -1.0, 2.0, 0.5])
    ids = sample(backend.to_device(np.tile(row, (40_000, 1))), backend.rng(0), top_k=4)
    assert ids.shape == (40_000,)
    np.testing.assert_array_equal(backend.to_host(sample(backend.to_device(np.tile(row, (40_000, 1))),
                                                         backend.rng(0), top_k=4)),
                                  backend.to_host(ids))
    counts = np.bincount(backend.to_host(ids), minlength=5)
    expected = np.where(row > -1.0, np.exp(row), 0.0)
    stat, dof = chi_square(counts, expected / expected.sum())
    assert counts[2] == 0 and stat < CHI2_999[dof]


# --- draw_next: the same tokens, and the finite check handed back instead of waited for ----------

@pytest.mark.parametrize("settings", [dict(greedy=True), dict(), dict(temperature=0.7, top_k=3),
                                      dict(top_p=0.8), dict(temperature=1.3, top_k=4, top_p=0.9)])
def test_draw_next_equals_sample_or_greedy(settings):
    z = np.random.default_rng(5).standard_normal((6, 9))
    ids, finite = draw_next(z, backend.rng(3, 1), **settings)
    if settings.get("greedy"):
        expected = greedy(z)
    else:
        expected = sample(z, backend.rng(3, 1), **settings)
    np.testing.assert_array_equal(ids, expected)
    assert bool(finite) is True


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")   # NaN - NaN, on purpose
@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("greedy_", [True, False])
def test_draw_next_reports_non_finite_rows_instead_of_raising(bad, greedy_):
    z = np.random.default_rng(5).standard_normal((3, 9))
    z[1, 4] = bad
    ids, finite = draw_next(z, backend.rng(0), greedy=greedy_)
    assert ids.shape == (3,) and bool(finite) is False
    with pytest.raises(NonFiniteLogits, match="finite largest logit"):
        sample(z, backend.rng(0))
    minus_inf_row = np.random.default_rng(5).standard_normal((2, 4))
    minus_inf_row[0] = -np.inf
    assert bool(draw_next(minus_inf_row, backend.rng(0), greedy=greedy_)[1]) is False
