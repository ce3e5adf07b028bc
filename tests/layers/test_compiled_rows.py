"""The layers' compiled loops (minitfm.speed.compiled, run by the row passes where Numba is installed)
held to the plain code: equal up to float32 rounding of sums taken in another order, the same
bits on one thread or three, and their Python source, run by the interpreter in float64, equal
to the plain float64 code (the loop's math, apart from the compiler)."""

import numpy as np
import pytest

from minitfm import backend
from minitfm.speed import compiled, rows
from minitfm.layers import feedforward, layernorm, loss, residual
from minitfm.speed import layernorm as fast_layernorm

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
    fast_layernorm.forward_loop.python(x, gamma, beta, y, xhat, rstd, 12 * layernorm.EPS)
    dgamma, dbeta = np.zeros(12), np.zeros(12)
    fast_layernorm.backward_loop.python(dy, xhat, rstd, gamma, dx, dgamma, dbeta)
    for result, plain in [(y, y_plain), (xhat, cache.xhat), (rstd, cache.rstd), (dx, dx_plain),
                          (dgamma, grads["gamma"]), (dbeta, grads["beta"])]:
        np.testing.assert_allclose(result, plain, rtol=1e-12, atol=1e-12)


def test_compiled_loops_take_small_arrays_and_leave_float64_to_the_plain_code():
    rows.use(True, 2, compiled=True)                # the default threshold of the NumPy blocks
    x = random((4, 8), 8)
    p = {"gamma": np.ones(8, np.float32), "beta": np.zeros(8, np.float32)}
    assert rows.compiled(x) and not rows.active(x)
    called = []
    original = fast_layernorm.forward_loop
    try:
        fast_layernorm.forward_loop = lambda *a: called.append(a[0].dtype) or original(*a)
        layernorm.forward(x, p)
        layernorm.forward(x.astype(np.float64), {k: v.astype(np.float64) for k, v in p.items()})
        rows.use(True, 2, compiled=False)
        layernorm.forward(x, p)
    finally:
        fast_layernorm.forward_loop = original
    assert called == [np.float32]


@pytest.mark.parametrize("pre_ln", [False, True])
@pytest.mark.parametrize("p_drop", [0.0, 0.1])
@pytest.mark.parametrize("shape", [(3, 5, 16), (64, 24, 96), (700, 48)])
def test_residual_compiled_loops_equal_the_plain_code(shape, pre_ln, p_drop):
    d = shape[-1]
    x, f, dy = random(shape, 7), random(shape, 8), random(shape, 9)
    bias, ln = random((d,), 10), {"gamma": random((d,), 11), "beta": random((d,), 12)}

    def compute():
        sublayer = lambda h: (f.copy(), None)                           # noqa: E731
        y, cache = residual.forward(x, sublayer, ln, p_drop, backend.rng(0, 3), pre_ln, bias)
        dx, g_ln = residual.backward(dy, cache, lambda df, c: (df * 2,))
        return y, dx, g_ln, cache

    plain, results = each_thread_count(compute)
    s = np.abs(x) + np.abs(f + bias) * (1 / (1 - p_drop))         # the sum before LayerNorm
    for y, dx, g_ln, cache in results:
        if p_drop:
            np.testing.assert_array_equal(cache.dropout.keep, plain[3].dropout.keep)
        xhat = plain[3].ln.xhat
        if pre_ln:                      # y = x + Dropout(f + b): the add alone, one rounding
            assert_close_to_rounding(y, plain[0], s, ulps=1)
        else:                           # LN(s): s's rounding, through the normalisation
            assert_close_to_rounding(y, plain[0], np.abs(ln["gamma"]) * (
                np.abs(xhat).max(axis=-1, keepdims=True) + s * plain[3].ln.rstd))
        np.testing.assert_allclose(dx, plain[1], rtol=1e-4, atol=1e-5 * np.abs(plain[1]).max())
        for name in ("gamma", "beta"):
            np.testing.assert_allclose(g_ln[name], plain[2][name], rtol=1e-4,
                                       atol=1e-5 * np.abs(plain[2][name]).max())
        np.testing.assert_array_equal(y, results[0][0])
        np.testing.assert_array_equal(dx, results[0][1])


@pytest.mark.parametrize("relu_drop", [0.0, 0.25])
@pytest.mark.parametrize("shape", [(3, 5, 16), (64, 24, 96), (700, 48)])
def test_feedforward_compiled_loops_give_the_plain_bits(shape, relu_drop):
    """b1 + ReLU and the ReLU's (and dropout's) backward: the same operations on each number
    (no multiply and add to fuse), so the plain code's bits."""
    d, d_ff = shape[-1], 2 * shape[-1]
    x, dy = random(shape, 13), random(shape, 14)
    p = {"w1": random((d, d_ff), 15) / 4, "b1": random((d_ff,), 16),
         "w2": random((d_ff, d), 17) / 4, "b2": random((d,), 18)}
    x[0, 0] = np.nan                                   # a NaN stays NaN through the ReLU
    calls = []

    def compute():
        y, cache = feedforward.forward(x, p, relu_drop, backend.rng(0, 5))
        dx, grads = feedforward.backward(dy, cache)
        calls.append(rows.compiled(x))
        return y, cache.a, dx, grads

    plain, results = each_thread_count(compute)
    assert calls == [False, True, True, True] and np.isnan(plain[1][0, 0]).all()
    for result in results:
        for a, b in zip(result[:3], plain[:3]):
            np.testing.assert_array_equal(a, b)
        for name in ("w1", "b1", "w2", "b2"):
            np.testing.assert_array_equal(result[3][name], plain[3][name])


def test_a_loop_that_numba_cannot_cache_is_compiled_all_the_same(monkeypatch):
    """Where Numba finds no writable place for its cache (a read-only installation, no
    writable home), the loop is compiled in the process instead of failing."""
    import numba
    njit, asked = numba.njit, []

    def no_cache(*args, cache=False, **options):
        if options.get("nogil"):        # the loop's compilation (Numba calls njit itself too)
            asked.append(cache)
        if cache:
            raise RuntimeError("cannot cache function 'double': no locator available")
        return njit(*args, cache=cache, **options)

    monkeypatch.setattr(numba, "njit", no_cache)

    def double(x, out):
        for i in range(x.shape[0]):
            out[i] = x[i] * compiled.float32(2.0)

    loop = compiled.kernel(double)
    x, out = np.arange(5, dtype=np.float32), np.zeros(5, np.float32)
    loop(x, out)
    assert asked == [True, False] and loop.python is double
    np.testing.assert_array_equal(out, 2 * x)


@pytest.mark.parametrize("pad_id, scale", [(None, None), (0, None), (0, 256.0)])
@pytest.mark.parametrize("n, v, smoothing", [(3, 11, 0.1), (700, 3000, 0.1), (90, 40000, 0.0)])
def test_loss_compiled_loops_equal_the_plain_code(n, v, smoothing, pad_id, scale):
    logits = random((n, v), 5) * 4
    targets = np.random.default_rng(6).integers(0, v, n)
    targets[: n // 3] = 0                           # some padding rows, with pad_id 0

    def compute():
        loss_scale = None if scale is None else np.asarray(scale, np.float32)
        (total, nll), dz = loss.forward_backward(logits.copy(), targets, smoothing, 0.25,
                                                 pad_id, loss_scale)
        (total2, nll2), none = loss.forward_backward(logits.copy(), targets, smoothing,
                                                     pad_id=pad_id)
        assert none is None and total2 == total and nll2 == nll
        return float(total), float(nll), dz

    plain, results = each_thread_count(compute)
    rows_kept = n - n // 3 if pad_id == 0 else n
    for total, nll, dz in results:
        # per row: a logsumexp of v terms, summed over the rows: float32 rounding of those
        bound = 4 * EPS32 * rows_kept * (np.abs(logits).max() + np.log(v))
        assert abs(total - plain[0]) <= bound and abs(nll - plain[1]) <= bound
        weight = 0.25 * (scale or 1.0)              # dz = weight * (p - q): |dz| <= weight
        assert_close_to_rounding(dz, plain[2], weight)
        np.testing.assert_array_equal(dz, results[0][2])


def test_a_ctrl_c_while_numba_compiles_is_held_back_then_raised():
    """A Ctrl-C that came while Numba imports and compiles is delivered once that is done, as
    the KeyboardInterrupt it would have been, even where the code it came in swallows it."""
    import os
    import signal
    import time
    swallowed = []

    def careless(seconds):              # code that swallows whatever it raises
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(seconds)
        except BaseException as exc:    # the hazard itself
            swallowed.append(exc)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)    # as in a command
    try:
        with pytest.raises(KeyboardInterrupt):
            with compiled.signals_held_back():
                careless(0.05)
        assert swallowed == []
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        careless(0.05)                  # without it, the interrupt is lost
        assert len(swallowed) == 1 and isinstance(swallowed[0], KeyboardInterrupt)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_every_compilation_holds_the_signals_back(monkeypatch):
    """Numba compiles on the first call and again on each call with argument types it has no
    machine code for (another dtype, another layout): each inside ``signals_held_back``;
    calls with known types run straight."""
    import contextlib
    held = []
    real = compiled.signals_held_back

    @contextlib.contextmanager
    def counted():
        held.append(True)
        with real():
            yield

    monkeypatch.setattr(compiled, "signals_held_back", counted)

    def triple(x, out):
        for i in range(x.shape[0]):
            out[i] = 3 * x[i]

    loop = compiled.kernel(triple)
    x = np.arange(6, dtype=np.float32)
    counts = []
    for a in (x, x, x.astype(np.float64), x[::2], x[::2]):
        out = np.zeros_like(a)
        loop(a, out)
        np.testing.assert_array_equal(out, 3 * a)
        counts.append(len(held))
    first = counts[0]
    assert first >= 1 and counts[1:] == [first, first + 1, first + 2, first + 2]
