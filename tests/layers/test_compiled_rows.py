"""The layers' compiled loops (minitfm.compiled, run by the row passes where Numba is installed)
held to the plain code: equal up to float32 rounding of sums taken in another order, the same
bits on one thread or three, and their Python source, run by the interpreter in float64, equal
to the plain float64 code (the loop's math, apart from the compiler)."""

import numpy as np
import pytest

from minitfm import compiled, rows
from minitfm.layers import layernorm

SHAPES = [(5, 16), (128, 24, 64), (3001, 40), (2, 3, 7), (64, 512)]
EPS32 = np.finfo(np.float32).eps


@pytest.fixture(autouse=True)
def on_numpy(numpy_backend):
    yield
    rows.use(False, 1)


def random(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def each_thread_count(compute):
    """``compute()`` with the plain code, then with the compiled loops on 1, 2 and 3 threads."""
    rows.use(False, 1)
    plain = compute()
    results = []
    for threads in (1, 2, 3):
        rows.use(True, threads, min_bytes=0, compiled=True)
        results.append(compute())
    rows.use(False, 1)
    return plain, results


def assert_close_to_rounding(result, plain, magnitude, ulps=16):
    """|result - plain| within ``ulps`` float32 units of ``magnitude`` (the size of the terms
    whose sums the two add in different orders)."""
    bound = ulps * EPS32 * magnitude
    assert result.shape == plain.shape
    assert np.all(np.abs(result - plain) <= bound), (np.abs(result - plain) / magnitude).max()


def test_numba_is_installed_with_minitfm():
    assert compiled.available()


@pytest.mark.parametrize("shape", SHAPES)
def test_layernorm_compiled_loops_equal_the_plain_code(shape):
    d = shape[-1]
    x, dy = random(shape, 1) * 3 + 1, random(shape, 2)
    p = {"gamma": random((d,), 3), "beta": random((d,), 4)}
    calls = []

    def compute():
        y, cache = layernorm.forward(x, p)
        dx, grads = layernorm.backward(dy, cache)
        calls.append(rows.compiled(x))
        return y, cache.xhat, cache.rstd, dx, grads

    plain, results = each_thread_count(compute)
    assert calls == [False, True, True, True]
    xhat = plain[1]
    row = lambda a: np.abs(a).max(axis=-1, keepdims=True)            # noqa: E731
    for result in results:
        assert_close_to_rounding(result[1], xhat, row(xhat))
        assert_close_to_rounding(result[0], plain[0], row(xhat) * np.abs(p["gamma"]).max()
                                 + np.abs(p["beta"]).max())
        assert_close_to_rounding(result[2], plain[2], plain[2])
        g = dy * p["gamma"]
        assert_close_to_rounding(result[3], plain[3],
                                 plain[2] * (row(g) + row(xhat) * row(g * xhat)))
        terms = {"gamma": dy * xhat, "beta": dy}
        for name in ("gamma", "beta"):
            magnitude = np.abs(terms[name]).reshape(-1, d).sum(axis=0)
            assert_close_to_rounding(result[4][name], plain[4][name], magnitude, ulps=4)
        for a, b in zip(result[:4], results[0][:4]):            # the blocks are the shape's
            np.testing.assert_array_equal(a, b)
        for name in ("gamma", "beta"):
            np.testing.assert_array_equal(result[4][name], results[0][4][name])


def test_layernorm_loops_in_the_interpreter_equal_the_plain_float64_code():
    x, dy = (np.random.default_rng(seed).standard_normal((7, 12)) for seed in (5, 6))
    gamma, beta = np.random.default_rng(7).standard_normal((2, 12))
    y_plain, cache = layernorm.forward(x, {"gamma": gamma, "beta": beta})
    dx_plain, grads = layernorm.backward(dy, cache)
    y, xhat, rstd, dx = (np.empty_like(a) for a in (x, x, cache.rstd, x))
    layernorm.forward_rows.python(x, gamma, beta, y, xhat, rstd, 12 * layernorm.EPS)
    dgamma, dbeta = np.zeros(12), np.zeros(12)
    layernorm.backward_rows.python(dy, xhat, rstd, gamma, dx, dgamma, dbeta)
    for result, plain in [(y, y_plain), (xhat, cache.xhat), (rstd, cache.rstd), (dx, dx_plain),
                          (dgamma, grads["gamma"]), (dbeta, grads["beta"])]:
        np.testing.assert_allclose(result, plain, rtol=1e-12, atol=1e-12)


def test_compiled_loops_take_small_arrays_and_leave_float64_to_the_plain_code():
    rows.use(True, 2, compiled=True)                # the default threshold of the NumPy blocks
    x = random((4, 8), 8)
    p = {"gamma": np.ones(8, np.float32), "beta": np.zeros(8, np.float32)}
    assert rows.compiled(x) and not rows.active(x)
    called = []
    original = layernorm.forward_rows
    try:
        layernorm.forward_rows = lambda *a: called.append(a[0].dtype) or original(*a)
        layernorm.forward(x, p)
        layernorm.forward(x.astype(np.float64), {k: v.astype(np.float64) for k, v in p.items()})
        rows.use(True, 2, compiled=False)
        layernorm.forward(x, p)
    finally:
        layernorm.forward_rows = original
    assert called == [np.float32]
