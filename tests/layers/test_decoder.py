"""The decoder stack's one-position step against its full-sequence forward pass."""

import numpy as np
import pytest

from minitfm import backend
from minitfm.gradcheck.check import random_params
from minitfm.layers import attention, decoder
from minitfm.models import translator


@pytest.mark.parametrize("pre_ln", [False, True])
def test_stack_step_equals_stack_forward(pre_ln):
    cfg = translator.Config.preset("tiny", pre_ln=pre_ln, d_model=12, n_heads=3)
    p = random_params(backend.host_rng(3), decoder.param_shapes(cfg), cfg.d_model)
    rng = np.random.default_rng(3)
    rows, length, src_len = 3, 5, 4
    x = rng.standard_normal((rows, length, cfg.d_model))
    memory = rng.standard_normal((rows, src_len, cfg.d_model))
    cross_mask = np.where(np.arange(src_len)[None] >= np.array([[4], [2], [1]]),
                          attention.MASKED, 0.0)[:, None, None, :]     # (R, 1, 1, S)
    full, _ = decoder.stack_forward(x, memory, p, attention.causal_mask(length, x.dtype), cross_mask,
                                    cfg, None)
    cross_k, cross_v = decoder.stack_cross_kv(memory, p, cfg)
    assert len(cross_k) == len(cross_v) == cfg.n_layers
    shape = (rows, cfg.n_heads, length, cfg.d_model // cfg.n_heads)
    self_k = [np.zeros(shape) for _ in range(cfg.n_layers)]
    self_v = [np.zeros(shape) for _ in range(cfg.n_layers)]
    for t in range(length):
        y = decoder.stack_step(x[:, t], p, self_k, self_v, cross_k, cross_v, cross_mask, t, cfg)
        np.testing.assert_allclose(y, full[:, t], rtol=0, atol=1e-12)
