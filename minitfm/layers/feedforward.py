"""Position-wise feed-forward network (paper, equation 2).

Forward
    h = x W1 + b1                    x (N, d_model), W1 (d_model, d_ff)
    a = max(0, h)                    ReLU
    a = dropout(a, p_relu)           ReLU dropout (optional; not in the paper, see below)
    y = a W2 + b2                    W2 (d_ff, d_model)

Backward
    dW2 = a^T dy,  db2 = sum dy,  da = dy W2^T
    da  = da * m / (1 - p_relu)      the dropout's backward (dropout.py), when it was applied
    dh  = da * [h > 0]               ReLU passes the gradient where it was active ([a > 0] is the
                                     same set; where dropout zeroed a, da is already 0)
    dW1 = x^T dh,  db1 = sum dh,  dx = dh W1^T

ReLU dropout (fairseq's "activation dropout", Tensor2Tensor's "relu_dropout") drops hidden units
of the feed-forward network: a regulariser for small corpora, off by default.

Parameters: the two linear layers' "w" and "b", numbered: "w1", "b1", "w2", "b2".

Its fast paths: ``minitfm/speed/feedforward.py``.
"""

from __future__ import annotations

from typing import NamedTuple

from minitfm import backend
from minitfm.layers import dropout, linear


class Cache(NamedTuple):
    first: linear.Cache     # x -> h
    a: object               # (..., d_ff) max(0, h) (after dropout), the second layer's input
    dropout: dropout.Cache | None   # the ReLU dropout's mask, or None
    second: linear.Cache    # a -> y


def param_shapes(d_model: int, d_ff: int) -> dict[str, tuple[int, ...]]:
    first, second = linear.param_shapes(d_model, d_ff), linear.param_shapes(d_ff, d_model)
    return {"w1": first["w"], "b1": first["b"], "w2": second["w"], "b2": second["b"]}


def forward(x, p, p_drop=0.0, rng=None, add_bias=True):
    """Return ``(y, cache)``; the ReLU (and its dropout) is applied in place on h.

    ``p_drop``: ReLU dropout, drawn from ``rng`` (none when ``rng`` is None: evaluation).
    ``add_bias=False``: b2 is left to the caller to add (``linear.forward``).
    """
    h, c_first = linear.forward(x, {"w": p["w1"], "b": p["b1"]})        # (..., d_ff)
    a = backend.xp.maximum(h, 0, out=h)                                # in place: a = max(0, h)
    a, c_drop = dropout.forward(a, p_drop, rng, inplace=True)          # a is ours
    y, c_second = linear.forward(a, {"w": p["w2"], "b": p["b2"]}, add_bias)   # (..., d_model)
    return y, Cache(c_first, a, c_drop, c_second)


def backward(dy, cache: Cache, out=None):
    """Return ``(dx, {"w1", "b1", "w2", "b2"})``."""
    out1 = None if out is None else {"w": out["w1"], "b": out["b1"]}
    out2 = None if out is None else {"w": out["w2"], "b": out["b2"]}
    da, g2 = linear.backward(dy, cache.second, out2)                   # (..., d_ff)
    if cache.dropout is not None:
        da, _ = dropout.backward(da, cache.dropout)
    da *= cache.a > 0                               # dh = da * [h > 0], in place
    dx, g1 = linear.backward(da, cache.first, out1)
    return dx, {"w1": g1["w"], "b1": g1["b"], "w2": g2["w"], "b2": g2["b"]}
