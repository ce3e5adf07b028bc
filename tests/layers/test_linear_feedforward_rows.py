"""The feed-forward network's row passes (minitfm.speed.rows: b1 + ReLU forward, the ReLU's and its
dropout's backward) against its plain code, bit for bit, on one thread and on two; and the
linear layer, whose bias add and db stay plain, giving the same bits with the passes on or off.
Bits are compared as integers, so that -0.0 against 0.0 and NaN payloads count too."""

import numpy as np
import pytest

from minitfm import backend
from minitfm.backend import products
from minitfm.speed import fused, rows
from minitfm.layers import dropout, feedforward, linear
from minitfm.speed import feedforward as fast_feedforward

SMALL_BLOCK = 1 << 12       # forces many blocks on small arrays: a ragged last one among them


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request, numpy_backend):
    """The threads the passes run on; the plain code again afterwards."""
    yield request.param
    rows.use(False, 1)


def counted_passes(monkeypatch, block_bytes=None):
    """The block counts of the row passes run from now on (a list that grows); with
    ``block_bytes``, the passes' blocks are that small."""
    counts = []

    def map_rows(fn, n_rows, row_bytes, default=rows.BLOCK_BYTES):
        parts = rows.blocks(n_rows, row_bytes, block_bytes or default)
        counts.append(len(parts))
        return rows.run(fn, parts)

    monkeypatch.setattr(rows, "map_rows", map_rows)
    return counts


def plain_and_rows(threads, fn):
    """``fn()`` with the plain code, then with the row passes on ``threads`` threads."""
    rows.use(False, 1)
    plain = fn()
    rows.use(True, threads, min_bytes=0, compiled=False)
    try:
        return plain, fn()
    finally:
        rows.use(False, 1)


def assert_same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    bits = {np.dtype(np.float32): np.uint32, np.dtype(np.float64): np.uint64}.get(a.dtype)
    if bits is None:
        np.testing.assert_array_equal(a, b)
    else:
        np.testing.assert_array_equal(a.view(bits), b.view(bits))


def random_params(shapes, seed, dtype=np.float32):
    r = np.random.default_rng(seed)
    return {k: r.standard_normal(s).astype(dtype) for k, s in shapes.items()}


def ff_step(x, p, dy, p_drop, out=None):
    """One feed-forward forward and backward, the ReLU dropout drawn from a fresh rng(0, 1)."""
    rng = backend.rng(0, 1) if p_drop else None
    y, cache = feedforward.forward(x, p, p_drop, rng)
    keep = None if cache.dropout is None else cache.dropout.keep
    dx, grads = feedforward.backward(dy, cache, out)
    return y, cache.a, keep, dx, grads


# (rows of x's leading axes, d_model, d_ff, the passes' block size: None for rows.BLOCK_BYTES)
SHAPES = {
    "fewer rows than a block": ((5,), 8, 16, None),
    "many blocks, ragged": ((997,), 12, 40, SMALL_BLOCK),
    "3-D input, many blocks": ((7, 61), 16, 24, SMALL_BLOCK),
    "3-D input, default blocks": ((4, 300), 16, 512, None),
}


@pytest.mark.parametrize("p_drop", [0.0, 0.3], ids=["no dropout", "ReLU dropout"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_feedforward_rows_give_the_plain_bits(threads, monkeypatch, shape, p_drop):
    lead, d_model, d_ff, block = shape
    counts = counted_passes(monkeypatch, block)
    r = np.random.default_rng(1)
    x = r.standard_normal((*lead, d_model)).astype(np.float32)
    dy = r.standard_normal((*lead, d_model)).astype(np.float32)
    p = random_params(feedforward.param_shapes(d_model, d_ff), 2)
    plain, fast = plain_and_rows(threads, lambda: ff_step(x, p, dy, p_drop))
    assert counts[0] >= 1 and len(counts) == 2            # forward's pass and backward's
    if block is not None:
        assert min(counts) >= 3
    for name, u, v in zip(["y", "a", "keep", "dx"], plain[:4], fast[:4]):
        if u is None:
            assert v is None, name
        else:
            assert_same_bits(u, v)
    assert plain[0].shape == (*lead, d_model)
    assert plain[1].min() >= 0 and (plain[1] == 0).any() and (plain[1] > 0).any()
    assert plain[4].keys() == fast[4].keys() == {"w1", "b1", "w2", "b2"}
    for k in plain[4]:
        assert_same_bits(plain[4][k], fast[4][k])


def test_feedforward_rows_write_the_out_buffers(threads, monkeypatch):
    counts = counted_passes(monkeypatch, SMALL_BLOCK)
    d_model, d_ff = 8, 32
    r = np.random.default_rng(3)
    x = r.standard_normal((3, 50, d_model)).astype(np.float32)
    dy = r.standard_normal((3, 50, d_model)).astype(np.float32)
    p = random_params(feedforward.param_shapes(d_model, d_ff), 4)

    def step():
        out = {k: np.full(s, np.nan, np.float32)          # whatever the buffer held before
               for k, s in feedforward.param_shapes(d_model, d_ff).items()}
        _, _, _, dx, grads = ff_step(x, p, dy, 0.2, out)
        assert all(grads[k] is out[k] for k in out)
        return dx, out

    (dx_plain, plain), (dx_rows, fast) = plain_and_rows(threads, step)
    assert len(counts) == 2 and min(counts) >= 3
    assert_same_bits(dx_plain, dx_rows)
    for k in plain:
        assert np.isfinite(fast[k]).all()
        assert_same_bits(plain[k], fast[k])


def test_bias_relu_rows_keep_signed_zeros_and_nans(threads, monkeypatch):
    counted_passes(monkeypatch, SMALL_BLOCK)
    r = np.random.default_rng(5)
    h = r.standard_normal((203, 48)).astype(np.float32)
    h[::3, ::2] = -0.0
    h[1::7] = [np.nan, np.inf, -np.inf, -0.0] * 12
    b = r.standard_normal(48).astype(np.float32)
    b[::4] = -0.0
    b[1] = np.nan

    def bias_relu():
        a = h.copy()
        if rows.active(a, b):
            return fast_feedforward.bias_relu_rows(a, b)
        a += b
        return np.maximum(a, 0, out=a)

    plain, fast = plain_and_rows(threads, bias_relu)
    assert np.isnan(plain).any() and (plain == 0).any()
    assert_same_bits(plain, fast)


# inf * 0 is NaN, with NumPy's warning (from the passes' threads too, where np.errstate of the
# calling thread does not reach)
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("p_drop", [0.0, 0.5], ids=["no dropout", "ReLU dropout"])
def test_relu_backward_rows_keep_signed_zeros_and_nans(threads, monkeypatch, p_drop):
    counts = counted_passes(monkeypatch, SMALL_BLOCK)
    r = np.random.default_rng(6)
    shape = (2, 151, 32)
    a = np.maximum(r.standard_normal(shape), 0).astype(np.float32)
    a[:, ::5] = 0.0
    da = r.standard_normal(shape).astype(np.float32)
    da[:, 1::4] = -0.0                  # -0.0 * [a > 0]: -0.0, as the plain multiply gives
    da[:, 2::9] = [np.nan, np.inf, -np.inf, -1e38] * 8
    c_drop = None
    if p_drop:
        keep, scale = backend.dropout_keep(backend.rng(0, 1), shape, p_drop)
        c_drop = dropout.Cache(keep, scale)
        a *= keep
    cache = feedforward.Cache(None, a, c_drop, None)

    def relu_dropout_backward():        # backward's lines between its two products
        dh = da.copy()
        if rows.active(dh, a):
            return fast_feedforward.relu_dropout_backward_rows(dh, cache)
        if c_drop is not None:
            dh, _ = dropout.backward(dh, c_drop)
        dh *= a > 0
        return dh

    plain, fast = plain_and_rows(threads, relu_dropout_backward)
    assert counts == [min(counts)] and counts[0] >= 3
    assert np.signbit(plain[plain == 0]).any() and np.isnan(plain).any()
    assert_same_bits(plain, fast)


def test_feedforward_rows_under_mixed_precision(threads, monkeypatch):
    counts = counted_passes(monkeypatch, SMALL_BLOCK)
    products.set_precision("fp16")       # put back by the process_choices_restored fixture
    r = np.random.default_rng(7)
    x = r.standard_normal((2, 90, 16)).astype(np.float32)
    dy = r.standard_normal((2, 90, 16)).astype(np.float32)
    p = random_params(feedforward.param_shapes(16, 64), 8)
    plain, fast = plain_and_rows(threads, lambda: ff_step(x, p, dy, 0.1))
    assert len(counts) == 2
    for u, v in zip(plain[:4], fast[:4]):
        assert_same_bits(u, v)
    for k in plain[4]:
        assert_same_bits(plain[4][k], fast[4][k])


def test_float64_runs_the_plain_code(threads, monkeypatch):
    counts = counted_passes(monkeypatch, SMALL_BLOCK)
    r = np.random.default_rng(9)
    x, dy = r.standard_normal((300, 8)), r.standard_normal((300, 8))
    p = random_params(feedforward.param_shapes(8, 24), 10, np.float64)
    plain, fast = plain_and_rows(threads, lambda: ff_step(x, p, dy, 0.2))
    assert counts == []
    assert plain[0].dtype == np.float64
    for u, v in zip(plain[:4], fast[:4]):
        assert_same_bits(u, v)


@pytest.mark.parametrize("lead", [(6,), (997,), (5, 211)], ids=["6 rows", "997 rows", "3-D"])
def test_linear_gives_the_plain_bits_with_rows_on(threads, monkeypatch, lead):
    """The bias add and db are linear's plain operations, row passes or not: db in particular
    sums every row in one sweep, whatever the threads."""
    counts = counted_passes(monkeypatch, SMALL_BLOCK)
    r = np.random.default_rng(11)
    x = r.standard_normal((*lead, 24)).astype(np.float32)
    dy = r.standard_normal((*lead, 40)).astype(np.float32)
    p = random_params(linear.param_shapes(24, 40), 12)

    def step():
        y, cache = linear.forward(x, p)
        out = {k: np.empty(s, np.float32) for k, s in linear.param_shapes(24, 40).items()}
        dx, grads = linear.backward(dy[..., ::-1].copy()[..., ::-1], cache, out)  # a strided dy
        return y, dx, grads, out

    plain, fast = plain_and_rows(threads, step)
    assert counts == []
    for u, v in zip(plain[:2], fast[:2]):
        assert_same_bits(u, v)
    for k in ("w", "b"):
        assert fast[2][k] is fast[3][k]
        assert_same_bits(plain[2][k], fast[2][k])
    assert_same_bits(fast[2]["b"], dy.reshape(-1, 40).sum(axis=0))


@pytest.mark.gpu
def test_no_row_pass_on_cupy(monkeypatch, cupy_backend):
    """On CuPy (here its double) the fused kernels or the plain code run, never a row pass."""
    counts = counted_passes(monkeypatch, SMALL_BLOCK)
    rows.use(True, 2, min_bytes=0, compiled=False)
    try:
        for kernels in ("plain", "fused"):
            fused.use(kernels)
            xp = cupy_backend
            x = xp.asarray(np.random.default_rng(13).standard_normal((40, 8)), dtype=xp.float32)
            p = {k: xp.asarray(v) for k, v in random_params(feedforward.param_shapes(8, 16),
                                                            14).items()}
            y, cache = feedforward.forward(x, p, 0.2, backend.rng(0, 1))
            feedforward.backward(xp.ones_like(y), cache)
    finally:
        rows.use(False, 1)
    assert counts == []
