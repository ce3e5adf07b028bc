"""Inverted dropout (paper, section 5.4: P_drop on every sub-layer output and on the embedding sums).

Forward (training, drop probability p, keep mask m_i ~ Bernoulli(1 - p))
    y = x * m / (1 - p)
so that E[y] = x and nothing needs rescaling at test time (p = 0, or no generator: y = x).
(p is rounded to a multiple of 2^-16 when the mask is drawn; see backend.dropout_keep.)

Backward
    dL/dx = dL/dy * m / (1 - p)      the same mask, the same scale

The mask comes from the generator passed in; the trainer passes ``backend.rng(seed, step, i)``
for the i-th batch of a step, so the masks are reproducible from those numbers alone: on NumPy
a ``numpy.random.Generator`` that draws 16-bit integers as raw bytes, on CuPy the counter-based
Philox stream (``minitfm.backend.philox``), computed with array operations and creating no generator on
the device. The two backends draw different masks. No parameters.

Its fast paths: ``minitfm/speed/dropout.py``.
"""

from __future__ import annotations

from typing import NamedTuple

from minitfm import backend


class Cache(NamedTuple):
    keep: object            # bool, the shape of x: the kept elements
    scale: float            # 1 / (1 - p)


def forward(x, p, rng=None, inplace=False):
    """Return ``(y, cache)``; identity (cache None) when ``p == 0`` or ``rng`` is None (evaluation).

    ``inplace=True`` writes y over x (for callers that own x and no longer need it).
    """
    if rng is None or p == 0.0:
        return x, None
    keep, scale = keep_mask(rng, x.shape, p)                # bool, same shape as x
    return apply(x, keep, scale, out=x if inplace else None), Cache(keep, scale)


def backward(dy, cache: Cache | None):
    """Return ``(dx, {})``."""
    if cache is None:
        return dy, {}
    return apply(dy, cache.keep, cache.scale), {}


def keep_mask(rng, shape, p: float):
    """``(keep, scale)``: a bool mask of ``shape`` keeping each element with probability 1 - p,
    and 1 / (1 - p) (:func:`minitfm.backend.dropout_keep`)."""
    return backend.dropout_keep(rng, shape, p)


def apply(x, keep, scale, out=None):
    """``x * keep * scale``, both ways of the pass (into ``out`` when given, which may be x)."""
    y = backend.xp.multiply(x, keep, out=out)
    y *= scale
    return y
