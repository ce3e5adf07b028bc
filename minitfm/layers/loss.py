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

The forward pass turns the logits buffer into the probabilities in place, and the backward pass
turns the probabilities into the gradient in place: a (N, V) array is allocated once.
"""

from __future__ import annotations

from minitfm import backend


def forward(logits, targets, smoothing, pad_id=None):
    """logits (N, V) float, targets (N,) int. Return ``((loss_sum, nll_sum), cache)``.

    ``loss_sum`` and ``nll_sum`` are 0-d arrays summed over the non-padding rows. ``logits`` is
    overwritten (it becomes the softmax probabilities, kept in the cache).
    """
    xp = backend.xp
    n, v = logits.shape
    rows = xp.arange(n)
    z = logits
    z -= z.max(axis=1, keepdims=True)                           # stable: max(z) = 0
    sum_z = z.sum(axis=1)                                       # (N,)
    z_y = z[rows, targets]                                      # (N,)
    p = xp.exp(z, out=z)
    lse = xp.log(p.sum(axis=1))                                 # (N,) logsumexp of shifted z
    p /= xp.exp(lse)[:, None]                                   # softmax, in place
    logp_y = z_y - lse
    sum_logp = sum_z - v * lse
    off = smoothing / (v - 1)
    loss = -(1.0 - smoothing) * logp_y - off * (sum_logp - logp_y)   # (N,)
    nll = -logp_y
    keep = None
    if pad_id is not None:
        keep = (targets != pad_id).astype(logits.dtype)         # (N,)
        loss = loss * keep
        nll = nll * keep
    return (loss.sum(), nll.sum()), (p, targets, smoothing, keep)


def backward(dloss, cache):
    """Return ``dlogits = dloss * (p - q)`` (N, V), computed in place over the cached p."""
    p, targets, smoothing, keep = cache
    xp = backend.xp
    n, v = p.shape
    off = smoothing / (v - 1)
    dz = p
    dz -= off                                                   # p - q off the target ...
    dz[xp.arange(n), targets] -= (1.0 - smoothing) - off        # ... and on it
    if keep is not None:
        dz *= keep[:, None]
    dz *= dloss
    return dz
