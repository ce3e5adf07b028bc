"""Linear (affine) layer.

Forward
    y = x W + b                      x (..., d_in), W (d_in, d_out), b (d_out,), y (..., d_out)

Backward (flatten the leading axes of x and y into N rows: X (N, d_in), dY (N, d_out))
    dL/dX = dY W^T                   each y_nj = sum_i x_ni W_ij + b_j depends on x_ni through W_ij
    dL/dW = X^T dY                   W_ij touches every row n: sum over n of x_ni dy_nj
    dL/db = sum_n dY                 b_j is added to every row

Parameters: "w" (d_in, d_out) and "b" (d_out,); without "b" the layer has no bias. The weight may
be any 2-D view, e.g. the transposed embedding matrix when the output projection is tied to the
embedding: ``forward(h, {"w": E.T})`` then ``dE = grads["w"].T``.

Its fast paths: ``minitfm/speed/linear.py``.
"""

from __future__ import annotations

from typing import NamedTuple

from minitfm import backend


class Cache(NamedTuple):
    x: object               # (..., d_in) the input
    w: object               # (d_in, d_out)
    has_bias: bool


def param_shapes(d_in: int, d_out: int) -> dict[str, tuple[int, ...]]:
    return {"w": (d_in, d_out), "b": (d_out,)}


def forward(x, p, add_bias=True):
    """Return ``(x @ p["w"] + p["b"], cache)``; with ``add_bias=False``, ``x @ p["w"]``: the caller
    adds b itself, and b's gradient is still this layer's."""
    w, b = p["w"], p.get("b")
    d_in, d_out = w.shape
    # one (N, d_in) @ (d_in, d_out) product: a stacked (B, T, d_in) @ w would run B small ones
    y = (x.reshape(-1, d_in) @ w).reshape(*x.shape[:-1], d_out)
    if b is not None and add_bias:
        y += b
    return y, Cache(x, w, b is not None)


def backward(dy, cache: Cache, out=None):
    """Return ``(dx, {"w": dw, "b": db})`` (no ``"b"`` when the forward had no bias)."""
    xp = backend.xp
    d_in, d_out = cache.w.shape
    dy2 = dy.reshape(-1, d_out)                             # (N, d_out)
    dx = (dy2 @ cache.w.T).reshape(cache.x.shape)           # (..., d_in)
    grads = {"w": xp.matmul(cache.x.reshape(-1, d_in).T, dy2,                  # (d_in, d_out)
                            out=None if out is None else out["w"])}
    if cache.has_bias:
        grads["b"] = dy2.sum(axis=0, out=None if out is None else out["b"])   # (d_out,)
    return dx, grads
