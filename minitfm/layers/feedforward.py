"""Position-wise feed-forward network (paper, equation 2).

Forward
    h = x W1 + b1                    x (N, d_model), W1 (d_model, d_ff)
    a = max(0, h)                    ReLU
    y = a W2 + b2                    W2 (d_ff, d_model)

Backward
    dW2 = a^T dy,  db2 = sum dy,  da = dy W2^T
    dh  = da * [h > 0]               ReLU passes the gradient where it was active ([a > 0] is the same set)
    dW1 = x^T dh,  db1 = sum dh,  dx = dh W1^T

Parameters: the two linear layers' "w" and "b", numbered: "w1", "b1", "w2", "b2".
"""

from __future__ import annotations

from typing import NamedTuple

from minitfm import backend
from minitfm.layers import linear


class Cache(NamedTuple):
    first: linear.Cache     # x -> h
    a: object               # (..., d_ff) max(0, h), the input of the second linear layer
    second: linear.Cache    # a -> y


def param_shapes(d_model: int, d_ff: int) -> dict[str, tuple[int, ...]]:
    first, second = linear.param_shapes(d_model, d_ff), linear.param_shapes(d_ff, d_model)
    return {"w1": first["w"], "b1": first["b"], "w2": second["w"], "b2": second["b"]}


def forward(x, p):
    """Return ``(y, cache)``; the ReLU is applied in place on h."""
    h, c_first = linear.forward(x, {"w": p["w1"], "b": p["b1"]})        # (..., d_ff)
    a = backend.xp.maximum(h, 0, out=h)                                # in place: a = max(0, h)
    y, c_second = linear.forward(a, {"w": p["w2"], "b": p["b2"]})       # (..., d_model)
    return y, Cache(c_first, a, c_second)


def backward(dy, cache: Cache, out=None):
    """Return ``(dx, {"w1", "b1", "w2", "b2"})``."""
    out1 = None if out is None else {"w": out["w1"], "b": out["b1"]}
    out2 = None if out is None else {"w": out["w2"], "b": out["b2"]}
    da, g2 = linear.backward(dy, cache.second, out2)
    da *= cache.a > 0                               # dh = da * [h > 0], in place
    dx, g1 = linear.backward(da, cache.first, out1)
    return dx, {"w1": g1["w"], "b1": g1["b"], "w2": g2["w"], "b2": g2["b"]}
