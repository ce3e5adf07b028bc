"""The learned position table: what its forward adds and where its gradient lands."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitfm.gradcheck.check import TOLERANCE, check_case
from minitfm.gradcheck.cases import CASES
from minitfm.layers import positional


@settings(max_examples=25)
@given(b=st.integers(1, 3), t=st.integers(1, 5), d=st.integers(1, 6), extra=st.integers(0, 4),
       seed=st.integers(0, 2**31 - 1), data=st.data())
def test_learned_positions_add_rows_and_sum_their_gradient_over_the_batch(b, t, d, extra, seed,
                                                                          data):
    rng = np.random.default_rng(seed)
    offset = data.draw(st.integers(0, extra))
    table = rng.standard_normal((t + extra, d))
    x = rng.standard_normal((b, t, d))
    y, cache = positional.learned_forward(x, {"table": table}, offset)
    np.testing.assert_array_equal(y, x + table[offset:offset + t][None])
    dy = rng.standard_normal(y.shape)
    dx, grads = positional.learned_backward(dy, cache)
    np.testing.assert_array_equal(dx, dy)
    expected = np.zeros_like(table)
    for row in range(b):                             # every batch row adds to the same positions
        expected[offset:offset + t] += dy[row]
    np.testing.assert_allclose(grads["table"], expected, rtol=1e-12, atol=1e-12)
    assert not grads["table"][:offset].any() and not grads["table"][offset + t:].any()


@settings(max_examples=10)
@given(b=st.integers(1, 3), t=st.integers(1, 4), d=st.integers(1, 5),
       seed=st.integers(0, 2**31 - 1))
def test_learned_positions_gradient_matches_finite_differences(b, t, d, seed):
    (case,) = [c for c in CASES if c.name == "positional (learned)"]
    errors = check_case(case, seed, dict(b=b, t=t, d=d))
    assert set(errors) == {"x", "table"}
    assert max(errors.values()) <= TOLERANCE


def test_positions_beyond_the_table_are_an_error():
    table = np.zeros((4, 3))
    with pytest.raises(ValueError, match="outside the learned table of 4 positions"):
        positional.learned_forward(np.zeros((1, 3, 3)), {"table": table}, offset=2)
