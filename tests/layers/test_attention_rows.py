"""Scaled dot-product attention's row pass (blocks of the batch on the worker's threads) against
the plain code: the same bits, with one thread or two; dropout, float64 and a decoding step's
self-attention (one query a row) take the plain code."""

import numpy as np
import pytest

from minitfm.speed import rows
from minitfm.layers import attention
from minitfm.speed import attention as fast_attention

H, D_K = 4, 64       # (4, 24, 64) float32 heads: a batch of 3 is one block, of 29 several


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def row_passes(request, numpy_backend):
    rows.use(True, request.param, min_bytes=0, compiled=False)
    yield request.param
    rows.use(False, 1)


@pytest.fixture
def blocks_seen(monkeypatch):
    """The blocks of the batch each attention pass ran on, in call order (None: the plain code)."""
    seen, real = [], fast_attention._row_blocks

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(fast_attention, "_row_blocks", spy)
    return seen


def block_counts(seen):
    return [None if blocks is None else len(blocks) for blocks in seen]


def plain(fn):
    """``fn()`` with the row passes off, then back on with the same threads."""
    threads = rows.threads()
    rows.use(False, 1)
    try:
        return fn()
    finally:
        rows.use(True, threads, min_bytes=0, compiled=False)


def assert_same_bits(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def inputs(b, t, s, mask, dtype=np.float32, seed=0):
    """q (B, H, T, d_k), k, v (B, H, S, d_k), dO (B, H, T, d_k): views of merged heads, as the
    multi-head layers pass them; the mask "padding" (B, 1, 1, S), "causal" (1, 1, T, T),
    "both" (B, 1, T, T) or None."""
    rng = np.random.default_rng(seed)
    (q,) = attention.split_heads(rng.standard_normal((b, t, H * D_K)).astype(dtype), 1, H)
    k, v = attention.split_heads(rng.standard_normal((b, s, 2 * H * D_K)).astype(dtype), 2, H)
    (do,) = attention.split_heads(rng.standard_normal((b, t, H * D_K)).astype(dtype), 1, H)
    lengths = rng.integers(1, s + 1, size=b)
    ids = np.where(np.arange(s)[None] < lengths[:, None], 5, 0)             # (B, S), 0: padding
    masks = {None: None, "padding": attention.padding_mask(ids, 0, dtype),
             "causal": attention.causal_mask(t, dtype) if t == s else None}
    masks["both"] = None if t != s else masks["causal"] + masks["padding"]
    return q, k, v, do, masks[mask]


def sdpa(q, k, v, do, mask, views, p_drop=0.0, seed=None):
    """O, P, P', dQ, dK, dV of one forward and backward pass; ``views``: written into views of
    merged heads (``heads_buffer``), the merged arrays returned."""
    rng = None if seed is None else np.random.default_rng(seed)
    if not views:
        o, cache = attention.sdpa_forward(q, k, v, mask, p_drop=p_drop, rng=rng)
        return (o, cache.p, cache.p_dropped) + attention.sdpa_backward(do, cache)[:3]
    b, h, t, d_k = q.shape
    o_merged, (o,) = attention.heads_buffer(b, t, 1, h, d_k, q.dtype)
    _, cache = attention.sdpa_forward(q, k, v, mask, o, p_drop, rng)
    dq_merged, (dq,) = attention.heads_buffer(b, t, 1, h, d_k, q.dtype)
    dkv, (dk, dv) = attention.heads_buffer(b, k.shape[2], 2, h, d_k, q.dtype)
    attention.sdpa_backward(do, cache, dq, dk, dv)
    return o_merged, cache.p, cache.p_dropped, dq_merged, dkv


@pytest.mark.parametrize("views", [False, True], ids=["fresh", "views"])
@pytest.mark.parametrize("b,t,s,mask", [
    (3, 24, 24, "padding"),             # a batch smaller than one block
    (29, 24, 24, "padding"),            # several blocks, of unequal sizes (29 is prime)
    (29, 24, 24, "causal"),
    (29, 24, 24, "both"),
    (29, 24, 24, None),
    (29, 24, 30, "padding"),            # cross-attention, T != S
    (3, 7, 5, None),
])
def test_row_pass_gives_the_plain_bits(row_passes, blocks_seen, b, t, s, mask, views):
    q, k, v, do, m = inputs(b, t, s, mask)
    got = sdpa(q, k, v, do, m, views)
    n_blocks = block_counts(blocks_seen)
    assert len(n_blocks) == 2 and n_blocks[0] == n_blocks[1]                # forward, backward
    several = 1 < n_blocks[0] and b % n_blocks[0] != 0        # several, of unequal sizes
    assert several if b == 29 else n_blocks[0] == 1
    assert_same_bits(got, plain(lambda: sdpa(q, k, v, do, m, views)))


def test_one_thread_and_two_give_the_same_bits(numpy_backend, blocks_seen):
    q, k, v, do, m = inputs(41, 24, 24, "both", seed=3)
    try:
        results = []
        for threads in (1, 2):
            rows.use(True, threads, min_bytes=0, compiled=False)
            results.append(sdpa(q, k, v, do, m, views=True))
    finally:
        rows.use(False, 1)
    assert block_counts(blocks_seen)[0] > 2
    assert_same_bits(*results)


def test_attention_dropout_takes_the_plain_code(row_passes, blocks_seen):
    """One generator stream draws the mask: blocks would draw other numbers."""
    q, k, v, do, m = inputs(29, 24, 24, "padding")
    got = sdpa(q, k, v, do, m, views=True, p_drop=0.1, seed=5)
    assert blocks_seen == [None, None]
    assert_same_bits(got, plain(lambda: sdpa(q, k, v, do, m, views=True, p_drop=0.1, seed=5)))
    sdpa(q, k, v, do, m, views=True, p_drop=0.1)        # evaluation (no generator): blocks
    assert None not in blocks_seen[4:]            # after the two runs above


def test_float64_takes_the_plain_code(row_passes, blocks_seen):
    q, k, v, do, m = inputs(29, 24, 24, "padding", dtype=np.float64)
    got = sdpa(q, k, v, do, m, views=False)
    assert blocks_seen == []          # the policy answers float64 before asking the chooser
    assert_same_bits(got, plain(lambda: sdpa(q, k, v, do, m, views=False)))


def params(shapes, d, seed):
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(shape) * (d ** -0.5 if len(shape) == 2 else 0.3))
            .astype(np.float32) for name, shape in shapes.items()}


def test_multi_head_layers_give_the_plain_bits(row_passes, blocks_seen, monkeypatch):
    """Against the same layers with attention's plain code, every other layer as it was (a row
    pass that sums over blocks, a bias's gradient, need not give the plain bits)."""
    b, t, s, d = 29, 24, 30, H * D_K
    rng = np.random.default_rng(7)
    x, memory, dy = (rng.standard_normal(shape).astype(np.float32)
                     for shape in ((b, t, d), (b, s, d), (b, t, d)))
    _, _, _, _, self_mask = inputs(b, t, t, "both", seed=8)
    _, _, _, _, src_mask = inputs(b, t, s, "padding", seed=9)
    p_self = params(attention.self_param_shapes(d), d, 10)
    p_cross = params(attention.cross_param_shapes(d), d, 11)

    def layers():
        y, cache = attention.self_forward(x, p_self, self_mask, H)
        dx, grads = attention.self_backward(dy, cache)
        z, c_cross = attention.cross_forward(y, memory, p_cross, src_mask, H)
        dz, dmemory, g_cross = attention.cross_backward(dy, c_cross)
        return (y, dx, *grads.values(), z, dz, dmemory, *g_cross.values())

    got = layers()
    assert len(blocks_seen) == 4 and None not in blocks_seen
    monkeypatch.setattr(fast_attention, "_row_blocks", lambda *args, **kwargs: None)
    assert_same_bits(got, layers())


def test_decoding_steps_give_the_plain_codes_bits(row_passes, blocks_seen, monkeypatch):
    """A step's self-attention has one query a row: the plain code. Its cross-attention has the
    G beams of a source as that source's queries, as a sentence's positions are in training: a
    row pass may take it, with the plain code's bits."""
    rows_, length, s, d, group = 12, 3, 5, H * D_K, 2
    rng = np.random.default_rng(12)
    p_self = params(attention.self_param_shapes(d), d, 13)
    p_cross = params(attention.cross_param_shapes(d), d, 14)
    memory = rng.standard_normal((rows_ // group, s, d)).astype(np.float32)
    k, v = attention.cross_kv(memory, p_cross, H)
    _, _, _, _, mask = inputs(rows_ // group, 1, s, "padding", seed=15)
    xs = [rng.standard_normal((rows_, d)).astype(np.float32) for _ in range(length)]

    def steps():
        k_buf = np.zeros((rows_, H, length, D_K), dtype=np.float32)
        v_buf = np.zeros_like(k_buf)
        return [y for t, x in enumerate(xs)
                for y in (attention.self_step(x, p_self, k_buf, v_buf, t, H),
                          attention.cross_step(x, p_cross, k, v, mask, H))]

    got = steps()
    assert blocks_seen[0::2] == [None] * length
    assert None not in blocks_seen[1::2]
    monkeypatch.setattr(fast_attention, "_row_blocks", lambda *args, **kwargs: None)
    assert_same_bits(got, steps())
