"""The encoder layer's one-position step (a decoder-only model's layer) against its forward pass
with a causal mask."""

import numpy as np
import pytest

from minitfm import gradcheck, model
from minitfm.layers import encoder, subdict


@pytest.mark.parametrize("pre_ln", [False, True])
def test_layer_step_equals_causal_layer_forward(pre_ln):
    cfg = model.Config.preset("tiny", pre_ln=pre_ln, d_model=12, n_heads=3, n_layers=1)
    rng = np.random.default_rng(7)
    p = subdict(gradcheck._stack_params(gradcheck.backend.host_rng(7), cfg, "enc."), "0.")
    rows, length = 3, 6
    x = rng.standard_normal((rows, length, cfg.d_model))
    full, _ = encoder.layer_forward(x, p, model.causal_mask(length, x.dtype), cfg, None)
    k_buf = np.zeros((rows, cfg.n_heads, length, cfg.d_model // cfg.n_heads))
    v_buf = np.zeros_like(k_buf)
    for t in range(length):
        y = encoder.layer_step(x[:, t], p, k_buf, v_buf, t, cfg)
        np.testing.assert_allclose(y, full[:, t], rtol=0, atol=1e-12)
