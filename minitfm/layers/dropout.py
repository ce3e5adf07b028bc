"""Inverted dropout (paper, section 5.4: P_drop on every sub-layer output and on the embedding sums).

Forward (training, drop probability p, keep mask m_i ~ Bernoulli(1 - p))
    y = x * m / (1 - p)
so that E[y] = x and nothing needs rescaling at test time (p = 0, or no generator: y = x).

Backward
    dL/dx = dL/dy * m / (1 - p)      the same mask, the same scale

The mask comes from the generator passed in; the model draws it from ``backend.rng(seed, step)``,
so the masks of a step are reproducible from the seed and the step alone.
"""

from __future__ import annotations


def forward(x, p, rng=None):
    """Return ``(y, cache)``; identity when ``p == 0`` or ``rng`` is None (evaluation)."""
    if rng is None or p == 0.0:
        return x, None
    keep = rng.random(x.shape, dtype=x.dtype) >= p     # bool, same shape as x
    y = x * keep
    y *= 1.0 / (1.0 - p)
    return y, (keep, p)


def backward(dy, cache):
    if cache is None:
        return dy, {}
    keep, p = cache
    dx = dy * keep
    dx *= 1.0 / (1.0 - p)
    return dx, {}
