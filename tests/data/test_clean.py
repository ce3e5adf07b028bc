"""Corpus cleaning: Moses' rules, and a report that accounts for every pair."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minitfm.data import CleanOptions, DataError, clean_parallel
from minitfm.data.clean import DROP_REASONS


def test_each_rule_and_the_report():
    options = CleanOptions(min_len=2, max_len=6, max_ratio=2.0, max_word_chars=10)
    pairs = [
        ("a  good \t pair ", "ein gutes Paar"),     # kept, whitespace normalized
        ("", "leer"),                               # empty
        ("   ", "leer"),                            # empty after stripping
        ("one", "eins zwei"),                       # too_short
        ("a b c d e f g", "a b c"),                 # too_long
        ("a b c d e", "a b"),                       # ratio 5/2 > 2
        ("a b c d", "a b"),                         # ratio 2: kept
        ("supercalifragilistic word", "x y"),       # long_word
    ]
    src, tgt, report = clean_parallel([s for s, _ in pairs], [t for _, t in pairs], options)
    assert src == ["a good pair", "a b c d"] and tgt == ["ein gutes Paar", "a b"]
    assert report.kept == 2 and report.total == len(pairs)
    assert report.dropped == {"empty": 2, "too_short": 1, "too_long": 1, "ratio": 1, "long_word": 1}
    assert "kept 2 of 8 pairs" in report.summary() and "empty 2" in report.summary()


def test_defaults_are_moses_ratio_and_wmt_lengths():
    assert CleanOptions() == CleanOptions(min_len=1, max_len=250, max_ratio=9.0,
                                          max_word_chars=1000)


@pytest.mark.parametrize("kwargs", [dict(min_len=0), dict(min_len=5, max_len=4),
                                    dict(max_ratio=0.5), dict(max_word_chars=0)])
def test_invalid_options(kwargs):
    with pytest.raises(DataError):
        CleanOptions(**kwargs)


def test_sides_of_different_length_are_refused():
    with pytest.raises(DataError, match="2 source but 1 target"):
        clean_parallel(["a", "b"], ["c"])


words = st.lists(st.sampled_from(["a", "bb", "ccc", "dddddddd"]), max_size=12).map(" ".join)


@given(st.lists(st.tuples(words, words), max_size=30),
       st.integers(1, 4), st.integers(4, 10), st.floats(1.0, 4.0))
def test_kept_pairs_satisfy_the_limits_and_counts_add_up(pairs, min_len, max_len, ratio):
    options = CleanOptions(min_len=min_len, max_len=max_len, max_ratio=ratio, max_word_chars=5)
    src, tgt, report = clean_parallel([s for s, _ in pairs], [t for _, t in pairs], options)
    assert report.total == len(pairs) and report.kept == len(src) == len(tgt)
    assert set(report.dropped) == set(DROP_REASONS)
    for s, t in zip(src, tgt):
        n_s, n_t = len(s.split()), len(t.split())
        assert min_len <= n_s <= max_len and min_len <= n_t <= max_len
        assert max(n_s, n_t) <= ratio * min(n_s, n_t)
        assert all(len(w) <= 5 for w in s.split() + t.split())
