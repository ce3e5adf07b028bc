"""The row passes of Adam over flat buffers and of the embedding's scatter-add, held to the plain
code bit for bit: Adam's update is element-wise, on blocks that depend on the buffers' size alone;
the embedding's sorted passes add each id's rows in their order, from the table's own value, as
``numpy.add.at`` does. Both compare the float32 bit patterns (so even -0.0 against 0.0 counts)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minitfm import flat, gradscale, optim
from minitfm.speed import rows
from minitfm.layers import embedding
from minitfm.speed import embedding as fast_embedding
from minitfm.speed import optim as fast_optim

# the Adam pass's row is five float32 numbers (p, g, m, v and adam_step's scratch)
PER_BLOCK = rows.BLOCK_BYTES // 20
SIZES = {"one block": 1000, "exactly four blocks": 4 * PER_BLOCK,
         "no multiple of a block": 4 * PER_BLOCK + 777}


@pytest.fixture(autouse=True)
def on_numpy(numpy_backend):
    rows.use(False, 1)
    yield
    rows.use(False, 1)


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def row_passes(request):
    """Switch the row passes on for the test's body (on 1 or 2 threads), off afterwards."""
    rows.use(True, request.param, min_bytes=0, compiled=False)
    yield request.param
    rows.use(False, 1)


def calls(monkeypatch, module, name) -> list:
    """Record each call of ``module.name`` (still calling it): the path a test takes."""
    real, seen = getattr(module, name), []

    def spy(*args, **kwargs):
        seen.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return seen


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32 if a.dtype == np.float32 else np.uint64)


# --- Adam over flat buffers --------------------------------------------------------------------

def adam_steps(n, weight_decay, steps=3, dtype=np.float32, scaler=None):
    """``steps`` updates of a flat model of ``n`` numbers (a decayed matrix, a bias that is not),
    with the row passes as they are switched now; the buffers p, m, v afterwards."""
    rng = np.random.default_rng(n)
    shapes = {"enc.0.w1": (n - n // 3,), "enc.0.b1": (n // 3,)}
    params = flat.zeros(shapes, dtype=dtype)
    params.buffer[...] = rng.standard_normal(n)
    opt = optim.Adam(params, weight_decay=weight_decay)
    grads = flat.zeros_like(params)
    for step in range(1, steps + 1):
        grads.buffer[...] = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)
        if scaler is not None:           # the second update overflowed: skipped
            scaler.state[...] = (1.0, 0.0, float(step >= 2), float(step == 2))
        opt.update(params, grads, 1e-3 * step, scaler)
    return params.buffer, opt.m.buffer, opt.v.buffer


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
@pytest.mark.parametrize("size", SIZES.values(), ids=SIZES.keys())
def test_adam_row_pass_gives_the_plain_bits(row_passes, monkeypatch, size, weight_decay):
    passes = calls(monkeypatch, fast_optim, "rows_flat_step")
    blocks = calls(monkeypatch, rows, "blocks")
    fast = adam_steps(size, weight_decay)
    assert len(passes) == 3
    assert (len(rows.blocks(*blocks[0])) > 1) == (size > PER_BLOCK)
    rows.use(False, 1)
    plain = adam_steps(size, weight_decay)
    assert len(passes) == 3                                  # the plain code took no row pass
    for a, b in zip(fast, plain):
        np.testing.assert_array_equal(bits(a), bits(b))


def test_adam_row_pass_gives_the_same_bits_on_one_and_two_threads():
    size = SIZES["no multiple of a block"]
    rows.use(True, 1, min_bytes=0, compiled=False)
    one = adam_steps(size, 0.1)
    rows.use(True, 2, min_bytes=0, compiled=False)
    two = adam_steps(size, 0.1)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(bits(a), bits(b))


def test_adam_row_pass_with_a_loss_scaler_gives_the_plain_bits(row_passes, monkeypatch):
    """The loss scaler's coefficients are 0-d arrays, its skipped update a no-op on each block."""
    passes = calls(monkeypatch, fast_optim, "rows_flat_step")
    size = SIZES["no multiple of a block"]
    fast = adam_steps(size, 0.1, scaler=gradscale.LossScaler(1.0))
    assert len(passes) == 3
    rows.use(False, 1)
    plain = adam_steps(size, 0.1, scaler=gradscale.LossScaler(1.0))
    for a, b in zip(fast, plain):
        np.testing.assert_array_equal(bits(a), bits(b))


def test_float64_adam_takes_the_plain_path(row_passes, monkeypatch):
    passes = calls(monkeypatch, fast_optim, "rows_flat_step")
    assert not rows.active(np.zeros(2, np.float64))
    adam_steps(SIZES["one block"], 0.1, dtype=np.float64)
    assert passes == []
    adam_steps(SIZES["one block"], 0.1)
    assert len(passes) == 3


# --- the embedding's scatter-add ---------------------------------------------------------------

def embedding_backward(ids, d, seed, out_init):
    """The table's gradient of ``ids`` with d columns (vocabulary 50), with the row passes as
    they are switched now: into a fresh table, or added into an ``out`` buffer (``out_init``)."""
    rng = np.random.default_rng(seed)
    dy = (rng.standard_normal(ids.shape + (d,)) * 10.0 ** rng.integers(-4, 4, ids.shape + (1,)))
    dy[..., :1] = 0.0                                # zeros, added into the -0.0 entries of out
    _, cache = embedding.forward(ids, {"table": np.zeros((50, d), np.float32)})
    out = None
    if out_init:
        table = rng.standard_normal((50, d)).astype(np.float32) * 100
        table[::3, 0] = -0.0
        out = {"table": table}
    _, grads = embedding.backward(dy.astype(np.float32), cache, out)
    return grads["table"]


def id_cases(rng):
    """Ids repeated in every way the pass treats apart: a few rows each (all in wide passes),
    one id everywhere (the one-by-one sums from the first row), many ids with a few rows and a
    few ids with hundreds (wide passes, then the one-by-one sums of the rest)."""
    skewed = np.where(rng.random((32, 24)) < 0.5, rng.integers(0, 3, (32, 24)),
                      rng.integers(0, 50, (32, 24)))
    return {"uniform": rng.integers(0, 50, (32, 24)), "one id": np.full((32, 24), 7),
            "skewed": skewed}


@pytest.mark.parametrize("out_init", [False, True], ids=["fresh table", "into out"])
@pytest.mark.parametrize("case", ["uniform", "one id", "skewed"])
def test_embedding_row_pass_gives_the_plain_bits(row_passes, monkeypatch, case, out_init):
    ids = id_cases(np.random.default_rng(0))[case]
    d = 2 * fast_embedding.ROW_PASS_MIN // ids.size            # large enough for the row pass
    passes = calls(monkeypatch, fast_embedding, "rows_scatter_add")
    fast = embedding_backward(ids, d, 1, out_init)
    assert len(passes) == 1
    rows.use(False, 1)
    plain = embedding_backward(ids, d, 1, out_init)
    assert len(passes) == 1
    np.testing.assert_array_equal(bits(fast), bits(plain))


def assert_add_at_bits(scatter_add, table, ids, values):
    """``scatter_add(table, ids, values)`` leaves in a copy of ``table`` the bits that
    numpy.add.at leaves in another."""
    expected, got = table.copy(), table.copy()
    np.add.at(expected, ids, values)
    scatter_add(got, ids, values)
    np.testing.assert_array_equal(bits(got), bits(expected))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 400), vocab=st.integers(1, 40), d=st.integers(2, 9),
       heavy=st.floats(0.0, 1.0), seed=st.integers(0, 2 ** 32 - 1))
def test_sorted_scatter_add_is_add_at_bit_for_bit(n, vocab, d, heavy, seed):
    """Any ids (a share ``heavy`` of them one id), into any table: numpy.add.at's bits."""
    rng = np.random.default_rng(seed)
    ids = np.where(rng.random(n) < heavy, 0, rng.integers(0, vocab, n))
    values = (rng.standard_normal((n, d)) * 10.0 ** rng.integers(-4, 4, (n, 1))).astype(np.float32)
    table = (rng.standard_normal((vocab, d)) * 10.0 ** rng.integers(-4, 4, (vocab, 1)))
    assert_add_at_bits(fast_embedding.rows_scatter_add, table.astype(np.float32), ids, values)


def test_sorted_scatter_add_counts_negative_ids_from_the_end_as_add_at_does():
    rng = np.random.default_rng(3)
    ids = np.array([-1, 4, 4, -1, 0, -5, 2] * 5)
    values = rng.standard_normal((ids.size, 3)).astype(np.float32)
    table = rng.standard_normal((5, 3)).astype(np.float32)
    assert_add_at_bits(fast_embedding.rows_scatter_add, table, ids, values)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("out_init", [False, True], ids=["fresh table", "into out"])
@pytest.mark.parametrize("case", ["uniform", "one id", "skewed"])
def test_embedding_compiled_loop_gives_the_plain_bits(monkeypatch, case, out_init, threads):
    ids = id_cases(np.random.default_rng(0))[case]
    rows.use(True, threads, compiled=True)
    passes = calls(monkeypatch, fast_embedding, "loops_scatter_add")
    fast = embedding_backward(ids, 3, 1, out_init)          # any size: a table of 3 columns
    assert len(passes) == 1
    rows.use(False, 1)
    plain = embedding_backward(ids, 3, 1, out_init)
    np.testing.assert_array_equal(bits(fast), bits(plain))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 300), vocab=st.integers(1, 40), d=st.integers(1, 5),
       threads=st.integers(1, 3), seed=st.integers(0, 2 ** 32 - 1))
def test_compiled_scatter_add_is_add_at_bit_for_bit(n, vocab, d, threads, seed):
    """Any ids, negative ones counted from the end, on any thread count: add.at's bits."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(-vocab, vocab, n)
    values = (rng.standard_normal((n, d)) * 10.0 ** rng.integers(-4, 4, (n, 1))).astype(np.float32)
    table = rng.standard_normal((vocab, d)).astype(np.float32)
    rows.use(True, threads, compiled=True)
    assert_add_at_bits(fast_embedding.loops_scatter_add, table, ids, values)


@pytest.mark.parametrize("bad", [5, -6])
def test_compiled_scatter_add_refuses_an_id_outside_the_table_as_add_at_does(bad):
    target, values = np.zeros((5, 2), np.float32), np.ones((3, 2), np.float32)
    rows.use(True, 2, compiled=True)
    with pytest.raises(IndexError):
        fast_embedding.loops_scatter_add(target, np.array([0, bad, 1]), values)


PLAIN_CASES = {"few numbers": ((32, 24), 2, np.float32),       # the sort's cost outweighs add.at's
               "one column": ((128, 160), 1, np.float32),      # d = 1: sums would be pairwise
               "float64": ((32, 24), 64, np.float64)}         # the gradient checks' precision


@pytest.mark.parametrize("what", PLAIN_CASES)
def test_embedding_takes_the_plain_path_where_the_pass_does_not_pay_or_apply(
        row_passes, monkeypatch, what):
    shape, d, dtype = PLAIN_CASES[what]
    ids = np.random.default_rng(0).integers(0, 50, shape)
    _, cache = embedding.forward(ids, {"table": np.zeros((50, d), dtype)})
    passes = calls(monkeypatch, fast_embedding, "rows_scatter_add")
    _, grads = embedding.backward(np.ones(shape + (d,), dtype), cache)
    dtable = grads["table"]
    assert passes == [] and dtable.dtype == dtype
    np.testing.assert_allclose(dtable[:, 0], np.bincount(ids.ravel(), minlength=50) * d ** 0.5,
                               rtol=1e-5)
