"""The scaled, masked softmax: its plain lines against the definition, and its compiled loops
(run by the row passes where Numba is installed) against the plain lines, within float32
rounding, the same bits on one thread or three."""

import numpy as np
import pytest

from minitfm.speed import policy, rows
from minitfm.layers import attention, softmax
from minitfm.speed import softmax as fast_softmax

from tests.layers.test_compiled_rows import each_thread_count

EPS32 = np.finfo(np.float32).eps


@pytest.fixture(autouse=True)
def on_numpy(numpy_backend):
    yield
    rows.use(False, 1)


def random(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def padding(b, s, seed):
    """A (b, 1, 1, s) key-padding mask, one key at least visible in each row."""
    lengths = np.random.default_rng(seed).integers(1, s + 1, b)
    ids = np.where(np.arange(s)[None, :] < lengths[:, None], 5, 0)
    return attention.padding_mask(ids, 0, np.float32)


def test_forward_is_the_definition_and_masked_keys_get_exactly_zero():
    s, mask = random((3, 2, 4, 6), 1, np.float64), padding(3, 6, 2).astype(np.float64)
    p = softmax.forward(s.copy(), 0.5, mask)
    z = s * 0.5 + mask
    expected = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(p, expected, rtol=1e-14, atol=1e-300)
    assert np.all(p[np.broadcast_to(mask, p.shape) < 0] == 0.0)
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=1e-14)


def test_backward_is_the_jacobian_product():
    s, dp = random((2, 3, 5), 3, np.float64), random((2, 3, 5), 4, np.float64)
    p = softmax.forward(s.copy(), 0.8)
    ds = softmax.backward(dp.copy(), p, 0.8)
    for i in np.ndindex(p.shape[:-1]):
        jacobian = np.diag(p[i]) - np.outer(p[i], p[i])      # dP_j / dz_i, symmetric
        np.testing.assert_allclose(ds[i], 0.8 * jacobian @ dp[i], rtol=1e-13, atol=1e-15)


def test_large_scores_do_not_overflow():
    s = np.array([[[[1e4, 1e4 - 1.0, -1e4]]]], dtype=np.float32)
    p = softmax.forward(s, 1.0)
    assert np.all(np.isfinite(p)) and p[0, 0, 0, 2] == 0.0
    np.testing.assert_allclose(p[0, 0, 0, :2], [1 / (1 + np.exp(-1)), 1 / (1 + np.e)], rtol=1e-6)


def forward_bound(s, scale, mask, p):
    """|P' - P| of two float32 softmaxes that differ in a row sum's order (ns - 1 roundings)
    and in whether the scale and mask are one rounding or two (z's error, times exp's slope)."""
    z = s * scale + (0.0 if mask is None else np.maximum(mask, -100.0))
    spread = np.abs(z - z.max(axis=-1, keepdims=True)).max(axis=-1, keepdims=True)
    return EPS32 * p * (s.shape[-1] + 4 + 2 * (spread + np.abs(z).max()))


def backward_bound(dp, p, scale):
    """|dS' - dS|: rowsum(dP P) in another order, then three roundings."""
    dot = np.abs(dp * p).sum(axis=-1, keepdims=True)
    return EPS32 * scale * p * ((dp.shape[-1] + 4) * dot + 4 * np.abs(dp))


@pytest.mark.parametrize("shape, masked", [((3, 2, 5, 7), "padding"), ((16, 4, 24, 24), "causal"),
                                           ((5, 3, 9, 40), None), ((2, 1, 1, 3), None)])
def test_compiled_loops_equal_the_plain_code(shape, masked):
    b, h, t, ns = shape
    s, dp = random(shape, 5) * 3, random(shape, 6)
    mask = {"padding": padding(b, ns, 7), "causal": attention.causal_mask(t, np.float32),
            None: None}[masked]
    rows.use(True, 1, min_bytes=0, compiled=True)
    assert policy.path(softmax.forward, s, 0.125, mask) == fast_softmax.loops_forward
    assert policy.path(softmax.backward, dp, s, 0.125) == fast_softmax.loops_backward
    p = softmax.forward(s.copy(), 0.125, mask)
    plain = policy.plain_function(softmax.forward)(s.copy(), 0.125, mask)
    assert np.all(np.abs(p - plain) <= forward_bound(s, 0.125, mask, plain))
    if mask is not None:
        assert np.all(p[np.broadcast_to(mask, p.shape) < 0] == 0.0)
    ds = softmax.backward(dp.copy(), plain, 0.125)
    assert np.all(np.abs(ds - policy.plain_function(softmax.backward)(dp.copy(), plain, 0.125))
                  <= backward_bound(dp, plain, 0.125))


def test_the_bounds_catch_a_wrong_loop():
    s, dp = random((4, 2, 6, 6), 8), random((4, 2, 6, 6), 9)
    rows.use(True, 1, min_bytes=0, compiled=True)
    plain = policy.plain_function(softmax.forward)(s.copy(), 0.5)
    p = fast_softmax.loops_forward(s.copy(), 0.5)
    assert not np.all(np.abs(p * (1 + 40 * EPS32) - plain) <= forward_bound(s, 0.5, None, plain))
    ds = fast_softmax.loops_backward(dp.copy(), plain, 0.5)
    off = policy.plain_function(softmax.backward)(dp.copy(), plain, 0.5 * (1 + 40 * EPS32))
    assert not np.all(np.abs(ds - off) <= backward_bound(dp, plain, 0.5))


@pytest.mark.parametrize("t, s", [(24, 24), (9, 31)])
def test_attention_with_the_loops_on_one_to_three_threads(t, s):
    """The loops inside attention's row pass (blocks of the batch): the plain code's result
    within rounding, the same bits on any thread count."""
    b, h, d_k = 40, 4, 16
    q, k, v = random((b, h, t, d_k), 10), random((b, h, s, d_k), 11), random((b, h, s, d_k), 12)
    do = random((b, h, t, d_k), 13)
    mask = attention.causal_mask(t, np.float32) if t == s else padding(b, s, 14)

    def compute():
        o, cache = attention.sdpa_forward(q, k, v, mask)
        return (o, cache.p) + attention.sdpa_backward(do, cache)[:3]

    plain, results = each_thread_count(compute)
    p = plain[1]
    scale = 1 / np.sqrt(d_k)
    for result in results:
        # P within the forward's bound; O, dQ, dK, dV, products of P or dS, within its relative
        # size (the products themselves are the same calls on the same blocks)
        z_bound = forward_bound(np.einsum("bhtd,bhsd->bhts", q, k), scale, mask, p)
        assert np.all(np.abs(result[1] - p) <= z_bound)
        for got, want in zip(result[2:], plain[2:]):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
        for a, c in zip(result, results[0]):
            np.testing.assert_array_equal(a, c)


def test_loops_in_the_interpreter_equal_the_plain_float64_code():
    s, dp = random((2, 3, 4, 7), 15, np.float64), random((2, 3, 4, 7), 16, np.float64)
    mask = np.broadcast_to(padding(2, 7, 17).astype(np.float64), s.shape)
    p = s.copy()
    fast_softmax.shift_loop.python(p, mask, True, 0.3)
    np.exp(p, out=p)
    fast_softmax.normalize_loop.python(p)
    plain = softmax.forward(s.copy(), 0.3, mask)
    np.testing.assert_allclose(p, plain, rtol=1e-12, atol=1e-300)
    ds = dp.copy()
    fast_softmax.backward_loop.python(ds, plain, 0.3)
    np.testing.assert_allclose(ds, softmax.backward(dp.copy(), plain, 0.3), rtol=1e-12,
                               atol=1e-15)


def test_float64_beam_scores_and_plain_runs_take_the_plain_lines():
    def paths(s, mask=None):
        return policy.path(softmax.forward, s, 1.0, mask), policy.path(softmax.backward, s, s, 1.0)

    plain = (policy.plain_function(softmax.forward), policy.plain_function(softmax.backward))
    rows.use(True, 2, min_bytes=0, compiled=True)
    assert paths(random((2, 2, 3, 3), 1, np.float64)) == plain
    assert paths(random((2, 2, 2, 3, 3), 1)) == plain
    assert paths(random((2, 2, 3, 3), 1), random((2, 1, 1, 1, 3), 2)) == (plain[0],
                                                                        fast_softmax.loops_backward)
    rows.use(True, 2, min_bytes=0, compiled=False)
    assert paths(random((2, 2, 3, 3), 1)) == plain
    rows.use(False, 1)
    assert paths(random((2, 2, 3, 3), 1)) == plain
