"""The diagnosis from two arrays: each kind of mistake named, and a right array left alone."""

import numpy as np

from minitfm.learn.diagnose import diagnose, distance, first_wrong, quantities


def right(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


KNOWN = quantities(dict(b=2, t=3, h=4, dk=9), {"1/(1-p), the dropout's scale": 1 / 0.7})


def test_a_right_gradient_gets_no_diagnosis():
    r = right(3, 4)
    assert diagnose("x", r + 1e-12, r, known=KNOWN) is None


def test_constant_factors_are_named():
    r = right(3, 4)
    assert "a factor 2 (= the batch size b) too many" in diagnose("x", 2 * r, r, known=KNOWN)
    assert "the wrong sign" in diagnose("x", -r, r, known=KNOWN)
    assert "the number of heads h" in diagnose("x", 4 * r, r, known=KNOWN)
    words = diagnose("x", r / 3, r, known=KNOWN)
    assert "sqrt(d_k)" in words and "missing" in words
    words = diagnose("x", 0.7 * r, r, known=KNOWN)
    assert "1/(1-p), the dropout's scale" in words and "missing" in words
    assert "0.37 times" in diagnose("x", 0.37 * r, r, known=KNOWN)
    words = diagnose("x", -2 * r, r, known=KNOWN)
    assert "too many" in words and "the wrong sign" in words


def test_a_transpose_is_named():
    r = right(3, 5)
    assert diagnose("w", r.T, r).startswith("a transpose")
    square = right(4, 4)
    assert diagnose("w", square.T, square).startswith("a transpose")
    heads = right(2, 3, 4, 4)
    assert "axes 2 and 3 swapped" in diagnose("s", heads.swapaxes(2, 3), heads)
    assert "axes in the wrong order" in diagnose("q", heads.transpose(0, 2, 1, 3),
                                                 heads.transpose(0, 1, 2, 3)[:, :, :, :])


def test_a_missing_sum_over_broadcast_axes_is_named():
    rows = right(2, 3, 5)
    words = diagnose("gamma", rows, rows.sum(axis=(0, 1)), axis_names=("b", "t", "d"))
    assert "a sum missing over axes 0, 1 (b, t)" in words and "summed, it is right" in words
    kept = right(4, 6)
    words = diagnose("rowsum", kept, kept.sum(axis=1, keepdims=True))
    assert "a sum missing over axis 1" in words


def test_swapped_gradients_are_named():
    a, b = right(3, 4), right(3, 4, seed=1)
    assert "the right gradient of beta" in diagnose("gamma", b, a, others={"gamma": a,
                                                                           "beta": b})


def test_a_named_mistake_wins():
    r = right(5)
    wrong = r - 0.5
    assert diagnose("x", wrong, r, mistakes={"term 2 is missing": wrong}) == "term 2 is missing"


def test_partly_wrong_not_finite_zero_and_missing():
    r = right(4, 5)
    a = r.copy()
    a[1] = 0.0
    assert "5 of 20 elements are wrong" in diagnose("x", a, r)
    a[2, 3] = np.nan
    assert "not finite" in diagnose("x", a, r)
    assert "all zero" in diagnose("x", np.zeros_like(r), r)
    assert "missing" in diagnose("x", None, r)
    assert "not an array" in diagnose("x", 3.0, r)
    assert diagnose("x", right(7), r).startswith("shape (7,)")


def test_the_first_wrong_element():
    r = right(3, 4)
    a = r.copy()
    a[1, 2] += 1.0
    index, yours, numeric = first_wrong(a, r, 1e-6)
    assert index == (1, 2) and yours == a[1, 2] and numeric == r[1, 2]
    assert first_wrong(r, r, 1e-6) is None
    assert distance(r, r.T) == float("inf") and distance(r, r) == 0.0
