"""Inverted dropout (paper, section 5.4: P_drop on every sub-layer output and on the embedding sums).

Forward (training, drop probability p, keep mask k_i ~ Bernoulli(1 - p))
    m = k / (1 - p)                  the scaled mask: 0 or 1 / (1 - p)
    y = x * m
so that E[y] = x and nothing needs rescaling at test time (p = 0, or no generator: y = x).
(p is rounded to a multiple of 2^-16 when the mask is drawn; see backend.dropout_keep.)

Backward
    dL/dx = dL/dy * m                the same scaled mask

The mask comes from the generator passed in; the model draws it from ``backend.rng(seed, step)``,
so the masks of a step are reproducible from the seed and the step alone. A forward pass with many
dropouts can draw all their masks at once (``Masks``: one draw instead of one per dropout) and
hand them to ``forward`` in place of the generator. No parameters.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from minitfm import backend


class Cache(NamedTuple):
    mask: object            # the shape of x: 0 where dropped, 1 / (1 - p) where kept


def draw_mask(generator, shape, p, dtype):
    """A scaled keep mask of ``shape`` in ``dtype``: 0 with probability p, else 1 / (1 - p)."""
    keep, scale = backend.dropout_keep(generator, shape, p)          # bool, and 1 / (1 - p)
    return backend.xp.multiply(keep, scale, dtype=dtype)


class Masks:
    """The scaled masks of ``size`` elements' dropouts, drawn in one go; ``take(shape)`` hands
    out the next ``prod(shape)`` of them as a view, in the order the dropouts ask.

    Pass it to ``forward`` where a generator goes: a forward pass then draws once, not once per
    dropout (the model sizes it for its embedding sums and every sub-layer output).
    """

    def __init__(self, generator, p, size, dtype):
        self.p = p
        self._masks = draw_mask(generator, (size,), p, dtype)        # (size,)
        self._taken = 0

    def take(self, shape, p):
        n = math.prod(shape)
        if p != self.p or self._taken + n > self._masks.size:
            raise ValueError(
                f"dropout.Masks holds masks for p={self.p}, {self._masks.size - self._taken} "
                f"elements left; a dropout asked for p={p} and shape {tuple(shape)}: size the "
                f"Masks for every dropout of the forward pass")
        mask = self._masks[self._taken:self._taken + n].reshape(shape)
        self._taken += n
        return mask


def forward(x, p, rng=None, inplace=False):
    """Return ``(y, cache)``; identity (cache None) when ``p == 0`` or ``rng`` is None (evaluation).

    ``rng``: a generator (this dropout draws its mask) or ``Masks`` (it takes the next one).
    ``inplace=True`` writes y over x (for callers that own x and no longer need it).
    """
    if rng is None or p == 0.0:
        return x, None
    if isinstance(rng, Masks):
        mask = rng.take(x.shape, p)
    else:
        mask = draw_mask(rng, x.shape, p, x.dtype)
    y = backend.xp.multiply(x, mask, out=x if inplace else None)
    return y, Cache(mask)


def backward(dy, cache: Cache | None):
    """Return ``(dx, {})``."""
    if cache is None:
        return dy, {}
    return dy * cache.mask, {}
