"""Linear (affine) layer.

Forward
    y = x W + b                      x (..., d_in), W (d_in, d_out), b (d_out,), y (..., d_out)

Backward (flatten the leading axes of x and y into N rows: X (N, d_in), dY (N, d_out))
    dL/dX = dY W^T                   each y_nj = sum_i x_ni W_ij + b_j depends on x_ni through W_ij
    dL/dW = X^T dY                   W_ij touches every row n: sum over n of x_ni dy_nj
    dL/db = sum_n dY                 b_j is added to every row

The weight may be any 2-D view, e.g. the transposed embedding matrix when the output projection is
tied to the embedding: ``forward(h, E.T)`` then ``dE = grads["w"].T``.
"""

from __future__ import annotations


def forward(x, w, b=None):
    """Return ``(x @ w + b, cache)``."""
    d_in, d_out = w.shape
    # one (N, d_in) @ (d_in, d_out) product: a stacked (B, T, d_in) @ w would run B small ones
    y = (x.reshape(-1, d_in) @ w).reshape(*x.shape[:-1], d_out)
    if b is not None:
        y += b
    return y, (x, w, b is not None)


def backward(dy, cache):
    """Return ``(dx, {"w": dw, "b": db})`` (no ``"b"`` when the forward had no bias)."""
    x, w, has_bias = cache
    d_in, d_out = w.shape
    dy2 = dy.reshape(-1, d_out)                     # (N, d_out)
    dx = (dy2 @ w.T).reshape(x.shape)               # (..., d_in)
    grads = {"w": x.reshape(-1, d_in).T @ dy2}      # (d_in, d_out)
    if has_bias:
        grads["b"] = dy2.sum(axis=0)                # (d_out,)
    return dx, grads
