"""Each one-position attention step against the full-sequence forward pass it mirrors."""

import numpy as np
import pytest

from minitfm.layers import attention


def _params(shapes, rng, d):
    return {k: rng.standard_normal(s) * (d ** -0.5 if len(s) == 2 else 0.3)
            for k, s in shapes.items()}


@pytest.mark.parametrize("rows,length,d,heads", [(1, 1, 4, 1), (3, 6, 8, 2), (2, 5, 12, 3)])
def test_self_step_equals_causal_self_forward(rows, length, d, heads):
    rng = np.random.default_rng(length * d)
    p = _params(attention.self_param_shapes(d), rng, d)
    x = rng.standard_normal((rows, length, d))
    full, _ = attention.self_forward(x, p, attention.causal_mask(length, x.dtype), heads)
    k_buf = np.zeros((rows, heads, length + 2, d // heads))          # room to spare: never read
    v_buf = np.zeros_like(k_buf)
    for t in range(length):
        y = attention.self_step(x[:, t], p, k_buf, v_buf, t, heads)
        np.testing.assert_allclose(y, full[:, t], rtol=0, atol=1e-12)


@pytest.mark.parametrize("rows,src_len,d,heads", [(1, 1, 4, 2), (3, 7, 6, 3)])
def test_cross_step_equals_cross_forward(rows, src_len, d, heads):
    rng = np.random.default_rng(src_len)
    p = _params(attention.cross_param_shapes(d), rng, d)
    x, memory = rng.standard_normal((rows, 4, d)), rng.standard_normal((rows, src_len, d))
    pad = np.arange(src_len)[None] >= rng.integers(1, src_len + 1, size=rows)[:, None]
    mask = np.where(pad, attention.MASKED, 0.0)[:, None, None, :]     # (R, 1, 1, S)
    full, _ = attention.cross_forward(x, memory, p, mask, heads)
    k, v = attention.cross_kv(memory, p, heads)
    assert k.shape == v.shape == (rows, heads, src_len, d // heads)
    for t in range(4):
        y = attention.cross_step(x[:, t], p, k, v, mask, heads)
        np.testing.assert_allclose(y, full[:, t], rtol=0, atol=1e-12)


@pytest.mark.parametrize("group", [2, 4])
def test_cross_step_rows_sharing_a_source_equal_rows_with_their_own(group):
    """G consecutive rows over one row of keys and values (the beams of a sentence) give what
    each row gives over its own copy of them."""
    rng = np.random.default_rng(group)
    d, heads, sentences, src_len = 8, 2, 3, 5
    p = _params(attention.cross_param_shapes(d), rng, d)
    memory = rng.standard_normal((sentences, src_len, d))
    pad = np.arange(src_len)[None] >= np.array([5, 2, 4])[:, None]
    mask = np.where(pad, attention.MASKED, 0.0)[:, None, None, :]     # (n, 1, 1, S)
    k, v = attention.cross_kv(memory, p, heads)
    x = rng.standard_normal((sentences * group, d))
    shared = attention.cross_step(x, p, k, v, mask, heads)
    own = attention.cross_step(x, p, *(np.repeat(a, group, axis=0) for a in (k, v, mask)), heads)
    np.testing.assert_allclose(shared, own, rtol=0, atol=1e-12)
