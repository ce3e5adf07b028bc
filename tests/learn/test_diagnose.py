"""The diagnosis from two arrays: each kind of mistake named (a factor, a transpose, a term of the
derivation off, two mistakes at once, a shift), where it is wrong said where nothing is named,
and a right array left alone."""

import numpy as np

from minitfm.learn.diagnose import (PASSED_THROUGH, Term, diagnose, distance, equal, first_wrong,
                                    quantities)
from minitfm.learn.locate import Region


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


def test_a_term_off_is_named_from_its_share():
    r, share, other = right(4, 5), right(4, 5, seed=1), right(4, 5, seed=2)
    terms = [Term("term 2 of dx", "-mean(g)", share), Term("term 3 of dx", "-xhat", other)]
    assert diagnose("x", r - share, r, terms=terms) == "term 2 of dx is missing: -mean(g)"
    assert diagnose("x", r - 2 * share, r, terms=terms) == \
        "term 2 of dx has the wrong sign: -mean(g)"
    assert diagnose("x", r + share, r, terms=terms).startswith("term 2 of dx is counted twice")
    words = diagnose("x", r + 0.2 * other, r, terms=terms, known=quantities(dict(d=6)))
    assert words.startswith("term 3 of dx is 1.2 times the right one (a factor 1.2 (= d/(d - 1))")
    words = diagnose("x", r - share - 2 * other, r, terms=terms)
    assert words.startswith("two terms are off: term 2 of dx is missing, and term 3 of dx has "
                            "the wrong sign")


def test_two_mistakes_at_once_are_asked_for_only_where_nothing_else_fits():
    r = right(3, 4)
    asked = []

    def more():
        asked.append(1)
        return {"two mistakes at once: A; and B": r + 1.0}
    assert "2 times" in diagnose("x", 2 * r, r, more=more) and not asked
    assert diagnose("x", r + 1.0, r, more=more) == "two mistakes at once: A; and B"
    assert asked


def test_a_mistake_that_fits_one_array_only_comes_last_and_says_so():
    r = right(3, 4)
    words = diagnose("x", r + 1.0, r, partly={"the mask is inverted": r + 1.0})
    assert words.startswith("the mask is inverted (so this array says")
    assert "2 times" in diagnose("x", 2 * r, r, partly={"the mask is inverted": 2 * r})


def test_not_finite_arrays_equal_where_their_nan_are_the_same():
    r = right(3, 4)
    a = r.copy()
    a[0, 1] = np.nan
    assert equal(a, a.copy()) and not equal(a, r) and not equal(r, a)
    assert diagnose("v", a, r, mistakes={"v averages g, not g^2": a.copy()}) == \
        "v averages g, not g^2"


def test_a_shift_by_one_is_named():
    r = right(6, 4)
    words = diagnose("table", np.roll(r, -1, axis=0), r, axis_names=("v", "d"))
    assert words.startswith("shifted by 1 along axis 0 (v)") and "off by 1" in words
    moved = np.zeros_like(r)
    moved[1:] = r[:-1]
    assert "shifted by 1" in diagnose("table", moved, r)


def test_where_it_is_wrong_in_words():
    r = right(3, 5, 4)
    a = r.copy()
    a[0] *= 3.0
    words = diagnose("x", a, r, axis_names=("b", "t", "d"), known=KNOWN)
    assert "20 of 60 elements are wrong, the others right" in words
    assert "only in the first sequence of the batch (b = 0)" in words
    assert "yours is 3 times the right value there" in words
    assert "mask" not in words and "index" not in words and "?" not in words
    hidden = np.zeros((3, 5), dtype=bool)
    hidden[1, 3:] = True
    a = r + 5.0 * hidden[:, :, None]
    words = diagnose("k", a, r, axis_names=("b", "kv", "dk"),
                     regions=[Region("where the padding mask hides keys", hidden, ("b", "kv"))])
    assert "wrong exactly where the padding mask hides keys" in words
    steps = (1, 10, 4000, 4001, 8000)
    lr = np.array([1.0, 2.0, 3.0, 2.5, 2.0])
    wrong = lr * (1 + np.array([0, 0, 0, 1, 1]))
    words = diagnose("lr", wrong, lr, labels={0: ("step", steps)}, known=quantities({}),
                     regions=[Region("after the warm-up", np.array(steps) > 4000)])
    assert "wrong exactly after the warm-up" in words
    assert "yours is 2 times the right value there (a factor 2 too many)" in words


def test_gradients_passed_through_or_of_another_shape_swapped():
    r, dy = right(3, 4), right(3, 4, seed=5)
    assert "it is dy, the gradient your backward was given" in diagnose(
        "x", dy, r, others={PASSED_THROUGH: dy})
    w1, w2 = right(6, 7), right(7, 6, seed=1)
    assert diagnose("w1", w2, w1, others={"w1": w1, "w2": w2}).startswith(
        "it is the right gradient of w2")


def test_a_stacks_n_is_its_number_of_layers():
    names = [q.name for q in quantities(dict(b=6, n=3), {"n": "the number of layers n"})]
    assert "the number of layers n" in names and "the number of rows n" not in names
    assert "the number of rows n" in [q.name for q in quantities(dict(n=5, v=7))]
    r = right(3, 4)
    assert "a factor 3 (= the number of layers n) too many" in diagnose(
        "x", 3 * r, r, known=quantities(dict(n=3), {"n": "the number of layers n"}))
