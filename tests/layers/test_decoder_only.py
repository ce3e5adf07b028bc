"""The decoder-only (language model) stack: its one-position steps against its forward pass, and
its causal mask."""

import numpy as np
import pytest

from minitfm import backend
from minitfm.gradcheck.check import random_params
from minitfm.layers import attention, decoder_only, encoder, subdict
from minitfm.models import lm


def _setup(pre_ln, n_layers, seed=7):
    cfg = lm.LMConfig.preset("tiny", pre_ln=pre_ln, d_model=12, n_heads=3, n_layers=n_layers)
    p = random_params(backend.host_rng(seed), decoder_only.param_shapes(cfg),
                                cfg.d_model)
    x = np.random.default_rng(seed).standard_normal((3, 6, cfg.d_model))       # (R, L, d)
    shape = (3, cfg.n_heads, 6, cfg.d_model // cfg.n_heads)
    return cfg, p, x, [np.zeros(shape) for _ in range(n_layers)], [np.zeros(shape)
                                                                   for _ in range(n_layers)]


@pytest.mark.parametrize("pre_ln", [False, True])
def test_layer_step_equals_the_encoder_layer_under_the_causal_mask(pre_ln):
    cfg, p, x, (k_buf,), (v_buf,) = _setup(pre_ln, 1)
    layer = subdict(p, "0.")
    full, _ = encoder.layer_forward(x, layer, attention.causal_mask(6, x.dtype), cfg, None)
    for t in range(x.shape[1]):
        y = decoder_only.layer_step(x[:, t], layer, k_buf, v_buf, t, cfg)
        np.testing.assert_allclose(y, full[:, t], rtol=0, atol=1e-12)


@pytest.mark.parametrize("pre_ln", [False, True])
def test_stack_step_equals_stack_forward(pre_ln):
    cfg, p, x, k_bufs, v_bufs = _setup(pre_ln, 2)
    full, _ = decoder_only.stack_forward(x, p, cfg, None)
    for t in range(x.shape[1]):
        y = decoder_only.stack_step(x[:, t], p, k_bufs, v_bufs, t, cfg)
        np.testing.assert_allclose(y, full[:, t], rtol=0, atol=1e-12)


def test_the_stack_is_causal():
    """Changing position t changes no output before t."""
    cfg, p, x, _, _ = _setup(True, 2)
    changed = x.copy()
    changed[:, 3] += np.random.default_rng(1).standard_normal(changed[:, 3].shape)
    a, _ = decoder_only.stack_forward(x, p, cfg, None)
    b, _ = decoder_only.stack_forward(changed, p, cfg, None)
    np.testing.assert_array_equal(a[:, :3], b[:, :3])
    assert not np.allclose(a[:, 3:], b[:, 3:])
