"""The row passes (minitfm.speed.rows): blocks that depend on the shape alone, shared among threads,
and the passes of the loss, LayerNorm and the residual connection held to the plain code: bit
for bit, but for the sums over rows (dgamma, dbeta), held to float32 rounding of their terms."""

import threading
import time

import numpy as np
import pytest

from minitfm import backend
from minitfm.speed import rows
from minitfm.layers import layernorm, linear, loss, residual

MODES = [(True, 1), (True, 2), (True, 3)]       # three threads on any machine: the pool's order


@pytest.fixture(autouse=True)
def on_numpy(numpy_backend):
    yield
    rows.use(False, 1)


def each_mode(compute):
    """``compute()`` with the plain code, then with the row passes on 1, 2 and 3 threads."""
    rows.use(False, 1)
    plain = compute()
    results = []
    for mode in MODES:
        rows.use(*mode, min_bytes=0, compiled=False)            # every pass, however small
        results.append(compute())
    rows.use(False, 1)
    return plain, results


def test_blocks_cover_the_rows_in_order_and_depend_on_the_shape_alone():
    for n, row_bytes in [(1, 4), (7, 1 << 20), (3072, 3072), (3072, 32000), (100_003, 12)]:
        parts = rows.blocks(n, row_bytes)
        assert parts[0].start == 0 and parts[-1].stop == n
        assert all(a.stop == b.start for a, b in zip(parts, parts[1:]))
        sizes = [p.stop - p.start for p in parts]
        assert max(sizes) - min(sizes) <= 1
        assert len(parts) == 1 or min(sizes) >= rows.MIN_ROWS
        assert len(parts) == 1 or max(sizes) * row_bytes <= rows.BLOCK_BYTES + row_bytes
        for threads in (1, 2, 5):
            rows.use(True, threads, min_bytes=0, compiled=False)
            assert rows.blocks(n, row_bytes) == parts


def test_no_rows_make_no_blocks():
    rows.use(True, 2, min_bytes=0, compiled=False)
    assert rows.blocks(0, 64) == [] and rows.map_rows(lambda part: 1 / 0, 0, 64) == []


def test_run_returns_results_in_order_from_every_thread():
    rows.use(True, 3, min_bytes=0, compiled=False)
    names = set()

    def work(i):
        names.add(threading.current_thread().name)
        assert not rows.active(np.zeros(2, np.float32))   # a block runs the plain code
        time.sleep(0.002)                                  # long enough for every thread
        return i * i

    assert rows.run(work, list(range(40))) == [i * i for i in range(40)]
    assert "MainThread" in names and len(names) == 3      # the caller and the pool's two


def test_the_caller_does_not_wait_for_a_thread_that_cannot_run():
    """With the pool's one thread held elsewhere, a pass runs all its parts in the caller and
    returns: it waits only for parts begun by other threads."""
    rows.use(True, 2, min_bytes=0, compiled=False)
    gate = threading.Event()

    def held(part):                   # the pool's thread waits at the gate; the caller does not
        if threading.current_thread().name.startswith("minitfm-rows"):
            gate.wait(30)
        return part

    holder = threading.Thread(target=rows.run, args=(held, list(range(8))))
    holder.start()
    time.sleep(0.2)                   # the pool's thread is at the gate now
    result = []
    caller = threading.Thread(target=lambda: result.append(rows.run(lambda p: -p, [1, 2, 3])))
    caller.start()
    caller.join(10)
    finished = not caller.is_alive()
    gate.set()
    holder.join(30)
    caller.join(30)
    assert finished and result == [[-1, -2, -3]]
    assert rows.active(np.zeros(2, np.float32))


def test_an_error_in_a_block_reaches_the_caller_after_every_block_ended():
    rows.use(True, 2, min_bytes=0, compiled=False)
    finished = []

    def work(i):
        if i == 1:
            raise ValueError("block 1")
        finished.append(i)

    with pytest.raises(ValueError, match="block 1"):
        rows.run(work, [0, 1, 2, 3])
    assert sorted(finished) == [0, 2, 3]


def test_small_arrays_run_the_plain_code():
    """Below MIN_BYTES in all, a pass fits in the cache whole and runs the plain code; the
    embedding's sorted scatter-add, not a pass over blocks, asks ``chosen`` alone."""
    rows.use(True, 2)
    small = np.zeros(rows.MIN_BYTES // 8, np.float32)
    assert not rows.active(small) and rows.active(small, small) and rows.chosen(small)
    rows.use(True, 2, min_bytes=0, compiled=False)
    assert rows.active(small[:1])


def test_only_chosen_float32_arrays_on_numpy_take_the_row_passes(monkeypatch):
    x32, x64 = np.zeros(3, np.float32), np.zeros(3)
    assert not rows.active(x32)
    rows.use(True, 2, min_bytes=0, compiled=False)
    assert rows.active(x32) and not rows.active(x64) and not rows.active(x32, x64)
    monkeypatch.setattr(backend, "name", "cupy")
    assert not rows.active(x32)
    with pytest.raises(ValueError, match="threads"):
        rows.use(True, 0, min_bytes=0, compiled=False)


# ---- the layers' passes -------------------------------------------------------------------------

SHAPES = [(5, 16), (128, 24, 64), (3001, 40), (2, 3, 7)]


def random(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def assert_row_sums_close(result, plain, terms):
    """Sums over rows added by block: equal to the plain sums up to float32 rounding of the sum
    of the terms' magnitudes (a few units in the last place of that)."""
    bound = 4 * np.finfo(np.float32).eps * np.abs(terms).reshape(-1, terms.shape[-1]).sum(axis=0)
    assert np.all(np.abs(result - plain) <= bound), np.abs(result - plain).max()


@pytest.mark.parametrize("shape", SHAPES)
def test_layernorm_rows_equal_the_plain_code(shape):
    x, dy = random(shape, 1), random(shape, 2)
    p = {"gamma": random(shape[-1:], 3), "beta": random(shape[-1:], 4)}

    def compute():
        y, cache = layernorm.forward(x, p)
        out = {"gamma": np.full(shape[-1], 9, np.float32), "beta": np.zeros(shape[-1], np.float32)}
        dx, grads = layernorm.backward(dy, cache, out)
        assert grads["gamma"] is out["gamma"] and grads["beta"] is out["beta"]
        return y, cache.xhat, cache.rstd, dx, grads

    plain, results = each_mode(compute)
    for result in results:
        for a, b in zip(result[:4], plain[:4]):
            np.testing.assert_array_equal(a, b)
            assert a.shape == b.shape
        assert_row_sums_close(result[4]["gamma"], plain[4]["gamma"], dy * plain[1])
        assert_row_sums_close(result[4]["beta"], plain[4]["beta"], dy)
        for name in ("gamma", "beta"):              # the blocks are the shape's: same bits
            np.testing.assert_array_equal(result[4][name], results[0][4][name])


@pytest.mark.parametrize("pad_id, scale", [(None, None), (0, None), (0, 256.0)])
@pytest.mark.parametrize("n, v", [(3, 11), (700, 3000), (90, 40000)])
def test_loss_rows_equal_the_plain_code(n, v, pad_id, scale):
    logits = random((n, v), 5)
    targets = np.random.default_rng(6).integers(0, v, n)
    targets[: n // 3] = 0                           # some padding rows, with pad_id 0

    def compute():
        z = logits.copy()
        loss_scale = None if scale is None else np.asarray(scale, np.float32)
        (total, nll), dz = loss.forward_backward(z, targets, 0.1, 0.25, pad_id, loss_scale)
        assert dz is z
        (total2, _), none = loss.forward_backward(logits.copy(), targets, 0.1, pad_id=pad_id)
        assert none is None and total2 == total
        return total, nll, dz

    plain, results = each_mode(compute)
    for result in results:
        assert result[0] == plain[0] and result[1] == plain[1]
        np.testing.assert_array_equal(result[2], plain[2])


def sublayer(w):
    return lambda h: linear.forward(h, w, add_bias=False)


def sublayer_backward(df, cache):
    dh, grads = linear.backward(df, cache)
    return dh, grads


@pytest.mark.parametrize("pre_ln", [False, True])
@pytest.mark.parametrize("p_drop", [0.0, 0.1])
@pytest.mark.parametrize("shape", [(3, 5, 16), (64, 24, 96), (700, 48)])
def test_residual_rows_equal_the_plain_code(shape, pre_ln, p_drop):
    d = shape[-1]
    x, dy = random(shape, 7), random(shape, 8)
    w = {"w": random((d, d), 9) / 8, "b": random((d,), 10)}
    ln = {"gamma": random((d,), 11), "beta": random((d,), 12)}

    def compute():
        y, cache = residual.forward(x.copy(), sublayer(w), ln, p_drop, backend.rng(0, 3), pre_ln,
                                    bias=w["b"])
        dx, g_sub, g_ln = residual.backward(dy.copy(), cache, sublayer_backward)
        return y, dx, g_sub, g_ln, cache

    plain, results = each_mode(compute)
    for result in results:
        np.testing.assert_array_equal(result[0], plain[0])
        if p_drop:
            np.testing.assert_array_equal(result[4].dropout.keep, plain[4].dropout.keep)
        for name in ("gamma", "beta"):  # sums over the rows, by block: float32 rounding apart
            np.testing.assert_allclose(result[3][name], plain[3][name], rtol=1e-5,
                                       atol=1e-6 * np.abs(plain[3][name]).max())
        # dx, and the sub-layer's dw, come through LayerNorm's dx: the plain bits
        np.testing.assert_array_equal(result[1], plain[1])
        np.testing.assert_array_equal(result[2]["w"], plain[2]["w"])
        np.testing.assert_array_equal(result[1], results[0][1])


def test_float64_runs_the_plain_code():
    rows.use(True, 2, min_bytes=0, compiled=False)
    x = np.random.default_rng(0).standard_normal((40, 8))
    p = {"gamma": np.ones(8), "beta": np.zeros(8)}
    rows.use(False, 1)
    y_plain, _ = layernorm.forward(x, p)
    rows.use(True, 2, min_bytes=0, compiled=False)
    calls = []
    original = rows.map_rows
    try:
        rows.map_rows = lambda *a, **k: calls.append(a) or original(*a, **k)
        y, _ = layernorm.forward(x, p)
    finally:
        rows.map_rows = original
    assert calls == [] and y.dtype == np.float64
    np.testing.assert_array_equal(y, y_plain)


def test_openblas_threads_sleep_soon_unless_the_environment_says_otherwise():
    from minitfm.workers import blas
    environ = {}
    assert blas.apply(environ) == {"OPENBLAS_THREAD_TIMEOUT": "16"} == environ
    environ = {"OPENBLAS_THREAD_TIMEOUT": "28"}
    assert blas.apply(environ) == {} and environ == {"OPENBLAS_THREAD_TIMEOUT": "28"}


def test_the_package_sets_it_before_numpy_loads_openblas():
    """Importing minitfm sets the variable and loads no NumPy: every module after it that does
    finds the variable in place."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    code = ("import sys, os, minitfm; print('numpy' in sys.modules, "
            "os.environ['OPENBLAS_THREAD_TIMEOUT'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.stdout.split() == ["False", "16"], done.stderr

