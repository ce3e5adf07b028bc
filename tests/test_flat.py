"""Named arrays as views into one flat buffer."""

import numpy as np
import pytest

from minitfm import flat

SHAPES = {"emb": (4, 3), "w": (3, 2), "b": (2,)}


def test_views_and_buffer_are_the_same_memory(numpy_backend):
    params = flat.zeros(SHAPES, np.float32)
    assert params.buffer.shape == (12 + 6 + 2,) and params.buffer.dtype == np.float32
    assert [name for name, _ in params.shapes()] == list(SHAPES)
    params["w"][1, 0] = 5.0                                   # through a named array ...
    assert params.buffer[12 + 2] == 5.0                       # ... into the buffer
    params.buffer[-1] = 7.0                                   # through the buffer ...
    assert params["b"][1] == 7.0                              # ... into the named array
    view = params["emb"]
    params["emb"] = np.arange(12).reshape(4, 3)               # assignment copies into the view
    assert params["emb"] is view and params.buffer[11] == 11.0


def test_layout_is_fixed(numpy_backend):
    params = flat.zeros(SHAPES)
    with pytest.raises(KeyError, match="not one of the arrays"):
        params["extra"] = np.zeros(2)
    with pytest.raises(TypeError):
        del params["w"]
    with pytest.raises(ValueError):
        params["w"] = np.zeros((2, 3))                        # a shape that does not fit


def test_flatten_copies_and_keeps_order_and_values(numpy_backend):
    rng = np.random.default_rng(0)
    arrays = {name: rng.standard_normal(shape) for name, shape in SHAPES.items()}
    packed = flat.flatten(arrays)
    assert list(packed) == list(arrays) and packed.buffer.dtype == np.float64
    for name, value in arrays.items():
        np.testing.assert_array_equal(packed[name], value)
        assert not np.shares_memory(packed[name], value)
    np.testing.assert_array_equal(packed.buffer, np.concatenate([a.ravel() for a in arrays.values()]))
    like = flat.zeros_like(packed)
    assert like.shapes() == packed.shapes() and not like.buffer.any()


def test_buffer_of_needs_one_layout(numpy_backend):
    a, b = flat.zeros(SHAPES), flat.zeros(SHAPES)
    assert flat.buffer_of(a, b) == (a.buffer, b.buffer)
    assert flat.buffer_of(a, dict(b)) is None                 # a plain dict: per-array work
    assert flat.buffer_of(a, flat.zeros({"w": (3, 2), "emb": (4, 3), "b": (2,)})) is None
    assert flat.buffer_of(a, flat.zeros(SHAPES, np.float64)) is None
