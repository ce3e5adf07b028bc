"""Label-smoothed cross-entropy, fused with its log-softmax (paper, section 5.4).

For one row of logits z (V,) with target y and smoothing eps, the smoothed target distribution
puts 1 - eps on y and spreads eps evenly over the other V - 1 classes:
    q_y = 1 - eps,    q_j = eps / (V - 1) for j != y
    log p = z - logsumexp(z)
    loss  = -sum_j q_j log p_j
          = -(1 - eps) log p_y - eps / (V - 1) * (sum_j log p_j - log p_y)
The plain negative log-likelihood -log p_y is reported beside it (perplexity = exp(mean nll)).

Backward: because sum_j q_j = 1,
    dloss/dz_j = sum_k q_k (p_j - [j = k]) = p_j - q_j
so the gradient is the softmax minus the smoothed target: no log-softmax Jacobian is ever formed.
Rows whose target is the padding id contribute nothing: zero loss and zero gradient.

The forward pass turns the logits buffer into exp(z - max(z)) in place and keeps it with the
row normalisers 1 / sum(exp); the backward pass turns that into the gradient in place, applying
the normalisation and dloss in one multiplication: a (N, V) array is allocated once, and swept as
few times as the math allows (it is the largest array of a training step). No parameters.

``forward_backward`` is the two in one call, as the output layer uses them. Its fast paths:
``minitfm/speed/loss.py``.
"""

from __future__ import annotations

from typing import NamedTuple

from minitfm import backend


class Cache(NamedTuple):
    e: object               # (N, V) exp(z - max z), over the logits buffer
    inv_total: object       # (N,) 1 / sum exp(z - max z)
    targets: object         # (N,) int
    smoothing: float
    keep: object            # (N,) 1.0 on non-padding rows, 0.0 on padding; None without pad_id


def forward(logits, targets, smoothing, pad_id=None):
    """logits (N, V) float, targets (N,) int. Return ``((loss_sum, nll_sum), cache)``.

    ``loss_sum`` and ``nll_sum`` are 0-d arrays summed over the non-padding rows. ``logits`` is
    overwritten (it becomes exp(logits - max), kept in the cache).
    """
    (loss, nll), cache = row_losses(logits, targets, smoothing, pad_id)
    return (loss.sum(), nll.sum()), cache


def row_losses(logits, targets, smoothing, pad_id):
    """``forward`` before its sums: ``((loss, nll), cache)``, loss and nll (N,) per row."""
    xp = backend.xp
    n, v = logits.shape
    z = logits
    z -= z.max(axis=1, keepdims=True)                           # stable: max(z) = 0
    z_y = z[xp.arange(n), targets]                              # (N,)
    sum_z = z.sum(axis=1) if smoothing else None                # (N,), only smoothing needs it
    e = xp.exp(z, out=z)                                        # (N, V) unnormalised softmax
    total = e.sum(axis=1)                                       # (N,)
    lse = xp.log(total)                                         # logsumexp of the shifted z
    logp_y = z_y - lse
    nll = -logp_y
    loss = (1.0 - smoothing) * nll
    if smoothing:
        off = smoothing / (v - 1)
        loss -= off * ((sum_z - v * lse) - logp_y)              # sum_{j != y} log p_j
    keep = None
    if pad_id is not None:
        keep = (targets != pad_id).astype(logits.dtype)         # (N,)
        loss = loss * keep
        nll = nll * keep
    return (loss, nll), Cache(e, 1.0 / total, targets, smoothing, keep)


def backward(dloss, cache: Cache):
    """Return ``(dlogits, {})``: dlogits = dloss * (p - q) (N, V), in place over the cached exp."""
    e, inv_total, targets, smoothing, keep = (cache.e, cache.inv_total, cache.targets,
                                              cache.smoothing, cache.keep)
    xp = backend.xp
    n, v = e.shape
    off = smoothing / (v - 1)
    weight = dloss if keep is None else dloss * keep            # scalar, or (N,): 0 on padding rows
    weight_col = weight if keep is None else weight[:, None]
    dz = e
    dz *= inv_total[:, None] * weight_col                       # weight * p
    if off:
        dz -= off * weight_col                                  # weight * (p - q) off the target ...
    dz[xp.arange(n), targets] -= (1.0 - smoothing - off) * weight   # ... and on it
    return dz, {}


def forward_backward(logits, targets, smoothing, dloss=None, pad_id=None, loss_scale=None):
    """``forward``, then with ``dloss`` ``backward``: ``((loss_sum, nll_sum), dlogits)`` (dlogits
    None without ``dloss``), the gradient over the logits buffer. ``loss_scale``: a 0-d device
    array multiplying ``dloss`` (mixed precision's loss scale)."""
    sums, cache = forward(logits, targets, smoothing, pad_id)
    if dloss is None:
        return sums, None
    return sums, backward(dloss if loss_scale is None else dloss * loss_scale, cache)[0]
