"""Dropout's scaled masks: one draw for a whole forward pass hands out the same kind of masks."""

import numpy as np
import pytest

from minitfm import backend, model
from minitfm.layers import dropout


def test_mask_is_zero_or_the_inverse_keep_rate(numpy_backend):
    mask = dropout.draw_mask(backend.rng(3), (50, 40), 0.25, np.float32)
    assert mask.dtype == np.float32 and mask.shape == (50, 40)
    assert set(np.unique(mask)) == {0.0, np.float32(1 / 0.75)}
    x = np.random.default_rng(0).standard_normal((50, 40)).astype(np.float32)
    y, cache = dropout.forward(x.copy(), 0.25, backend.rng(3))
    np.testing.assert_array_equal(y, x * mask)                   # the same draw, the same mask
    dx, _ = dropout.backward(np.ones_like(x), cache)
    np.testing.assert_array_equal(dx, mask)


def test_masks_are_handed_out_in_order_from_one_draw(numpy_backend):
    whole = dropout.draw_mask(backend.rng(4), (2 * 3 * 5 + 4 * 5,), 0.5, np.float32)
    masks = dropout.Masks(backend.rng(4), 0.5, whole.size, np.float32)
    first = dropout.forward(np.ones((2, 3, 5), np.float32), 0.5, masks)[1].mask
    second = dropout.forward(np.ones((4, 5), np.float32), 0.5, masks)[1].mask
    np.testing.assert_array_equal(first.reshape(-1), whole[:30])
    np.testing.assert_array_equal(second.reshape(-1), whole[30:])
    with pytest.raises(ValueError, match="elements left"):
        masks.take((1,), 0.5)
    with pytest.raises(ValueError, match="p=0.5"):
        dropout.Masks(backend.rng(4), 0.5, 10, np.float32).take((2,), 0.1)


def test_the_model_sizes_its_masks_for_every_dropout_of_the_pass(numpy_backend):
    cfg = model.Config.preset("tiny").replace(dropout=0.3)
    params = model.init_params(cfg, seed=0)
    src = np.array([[5, 6, 7, 3], [8, 3, 0, 0]])
    tgt = np.array([[2, 5, 9, 3], [2, 4, 3, 0]])
    masks = model.dropout_masks(backend.rng(1), cfg, src.shape, tgt[:, :-1].shape, np.float32)
    memory, src_mask, _ = model.encoder_forward(params, cfg, src, masks)
    model.decoder_forward(params, cfg, tgt[:, :-1], memory, src_mask, masks)
    with pytest.raises(ValueError, match="0 elements left"):    # every mask taken, none spare
        masks.take((1,), cfg.dropout)
