"""The scaled, masked softmax of attention's scores (paper, equation 1: softmax(Q K^T / sqrt(d_k))).

Forward, for each row s of the scores (a query's S keys; T rows per batch element and head)
    z = s * c + m                    c = 1 / sqrt(d_k), m the additive mask's row (attention.py)
    P_i = exp(z_i - max z) / sum_j exp(z_j - max z)
Subtracting the row's max changes nothing in exact arithmetic (it cancels between numerator and
denominator) and keeps exp from overflowing; a masked key (m = -1e9) gets exactly 0.

Backward, dP given (m is a constant: no gradient)
    dP_j/dz_i = P_j (1[i = j] - P_i)                      the softmax's Jacobian
    dz_i = sum_j dP_j P_j (1[i = j] - P_i) = P_i (dP_i - sum_j dP_j P_j)
    ds_i = c dz_i                    attention folds 1/sqrt(d_k) in here, once for dQ and dK
Both passes work in place: the forward overwrites the scores with P, the backward dP with ds.

Its fast paths: ``minitfm/speed/softmax.py``.
"""

from __future__ import annotations

from minitfm import backend


def forward(s, scale, mask=None):
    """P = softmax(s * scale + mask) over the last axis, in place on the scores s; ``mask``
    broadcasts to s."""
    s *= scale
    if mask is not None:
        s += mask
    s -= s.max(axis=-1, keepdims=True)
    p = backend.xp.exp(s, out=s)
    p /= p.sum(axis=-1, keepdims=True)
    return p


def backward(dp, p, scale):
    """dS = P * (dP - rowsum(dP * P)) * scale, in place on dP."""
    dp -= backend.xp.einsum("...ts,...ts->...t", dp, p)[..., None]     # rowsum(dP * P), one pass
    ds = dp
    ds *= p                                         # dS = P * (dP - rowsum(dP * P))
    ds *= scale                                     # fold 1/sqrt(d_k) in once for dQ and dK
    return ds
