"""Position-wise feed-forward network (paper, equation 2).

Forward
    h = x W1 + b1                    x (N, d_model), W1 (d_model, d_ff)
    a = max(0, h)                    ReLU
    y = a W2 + b2                    W2 (d_ff, d_model)

Backward
    dW2 = a^T dy,  db2 = sum dy,  da = dy W2^T
    dh  = da * [h > 0]               ReLU passes the gradient where it was active ([a > 0] is the same set)
    dW1 = x^T dh,  db1 = sum dh,  dx = dh W1^T
"""

from __future__ import annotations

from minitfm import backend
from minitfm.layers import linear


def forward(x, w1, b1, w2, b2):
    """Return ``(y, cache)``; the ReLU is applied in place on h."""
    h, cache1 = linear.forward(x, w1, b1)           # (..., d_ff)
    a = backend.xp.maximum(h, 0, out=h)            # in place: a = max(0, h)
    y, cache2 = linear.forward(a, w2, b2)           # (..., d_model)
    return y, (cache1, cache2)


def backward(dy, cache):
    """Return ``(dx, {"w1", "b1", "w2", "b2"})``."""
    cache1, cache2 = cache
    a = cache2[0]
    da, g2 = linear.backward(dy, cache2)
    da *= a > 0                                     # dh = da * [h > 0], in place
    dx, g1 = linear.backward(da, cache1)
    return dx, {"w1": g1["w"], "b1": g1["b"], "w2": g2["w"], "b2": g2["b"]}
