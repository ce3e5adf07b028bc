"""Choosing the next token from a language model's logits: temperature, top-k, top-p, a draw.

Given logits ``z`` (R, V), one row per sequence being generated, the next token of row r is drawn
from

    q_r(i) = exp(z'_ri) / sum_j exp(z'_rj)

where ``z'`` is ``z`` after, in this order (the order of common practice):

    temperature T > 0    z' = z / T: T < 1 sharpens the distribution, T > 1 flattens it; as
                         T -> 0 it puts all its mass on the argmax (:func:`greedy`)
    top-k, 1 <= k <= V   keep the k largest logits of each row, set the rest to -inf
    top-p, 0 < p <= 1    "nucleus": sort the tokens by probability, p_(1) >= p_(2) >= ...;
                         keep the smallest prefix whose mass reaches p, i.e. token (i) is kept iff
                         p_(1) + ... + p_(i-1) < p; the most likely token is always kept

A logit set to -inf has probability exactly 0 after the softmax, so filtering renormalises the
kept tokens' probabilities among themselves. Ties are broken towards the lower token id, so the
filters keep exactly k tokens (and top-p the smallest set) on every backend.

The draw is inverse-CDF sampling, one uniform number per row: with the cumulative sums
``c_i = q(0) + ... + q(i)`` and ``u`` uniform in (0, 1], the token is the first ``i`` with
``c_i >= u``; it is ``i`` with probability ``c_i - c_(i-1) = q(i)``. The uniform numbers come from
the generator passed in (``backend.rng(seed, ...)``), so the same seed gives the same tokens.

Every function is pure (inputs are never modified) and uses ``backend.xp`` only, so the same
code samples on NumPy and on CuPy.
"""

from __future__ import annotations

import math
import numbers
import operator

from minitfm import backend

__all__ = ["apply_temperature", "top_k_filter", "top_p_filter", "filter_logits", "probabilities",
           "greedy", "draw", "sample", "draw_next", "check_settings", "NonFiniteLogits"]


def _check_logits(logits, what: str = "logits", finite: bool = True):
    """The (R, V) float logits on the active backend, each row with a finite maximum.

    The shape and dtype are checked on the host; the finite maximum (``finite=True``) needs the
    device's answer, a wait for the device: the public functions check once, at their entry,
    and :func:`draw_next` hands the answer back with the tokens instead."""
    logits = backend.check_array(logits, what)
    if logits.ndim != 2 or logits.shape[0] < 1 or logits.shape[1] < 1:
        raise ValueError(f"{what} must be a 2-D (rows, vocabulary) array with at least one row "
                         f"and one token, got shape {tuple(logits.shape)}")
    if logits.dtype.kind != "f":
        raise TypeError(f"{what} must be floating point, got dtype {logits.dtype}")
    if finite and not bool(_finite_rows(logits)):
        raise NonFiniteLogits(what)
    return logits


class NonFiniteLogits(ValueError):
    """Logits with NaN or +inf, or a row whose every entry is -inf."""

    def __init__(self, what: str = "logits") -> None:
        super().__init__(f"{what} hold NaN or +inf, or a row whose every entry is -inf: each row "
                         f"needs a finite largest logit")


def _finite_rows(logits):
    """0-d bool on the device: every row of ``logits`` has a finite largest entry."""
    return backend.xp.isfinite(logits.max(axis=-1)).all()


def _check_temperature(temperature) -> float:
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a number, got {temperature!r}")
    if not (math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be finite and > 0, got {temperature}; for the most "
                         f"likely token every time, use greedy decoding instead")
    return float(temperature)


def _check_top_k(top_k, vocab: int) -> int:
    try:
        if isinstance(top_k, bool):
            raise TypeError
        k = operator.index(top_k)
    except TypeError:
        raise TypeError(f"top_k must be an integer, got {top_k!r}") from None
    if not 1 <= k <= vocab:
        raise ValueError(f"top_k must be between 1 and the vocabulary size {vocab}, got {k}")
    return k


def _check_top_p(top_p) -> float:
    if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real):
        raise TypeError(f"top_p must be a number, got {top_p!r}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    return float(top_p)


def _order(logits):
    """(R, V) token ids of each row from the largest logit down, ties to the lower id."""
    return backend.xp.argsort(-logits, axis=-1, kind="stable")


def apply_temperature(logits, temperature: float):
    """``z / T`` (R, V), in the logits' dtype."""
    logits = _check_logits(logits)
    return logits / _check_temperature(temperature)


def top_k_filter(logits, top_k: int):
    """A copy of ``logits`` (R, V) with all but the ``top_k`` largest of each row set to -inf.

    Exactly ``top_k`` entries per row stay finite; among equal logits the lower ids are kept.
    """
    logits = _check_logits(logits)
    return _top_k(logits, _check_top_k(top_k, logits.shape[1]))


def _top_k(logits, k: int):
    xp = backend.xp
    out = logits.copy()
    rows = xp.arange(logits.shape[0])[:, None]     # (R, 1)
    out[rows, _order(logits)[:, k:]] = -xp.inf     # the V - k smallest of each row
    return out


def top_p_filter(logits, top_p: float):
    """A copy of ``logits`` (R, V) keeping, per row, the smallest set of most likely tokens whose
    probability mass is at least ``top_p``; the others are set to -inf.

    In probability order, token (i) is kept iff the mass before it, p_(1) + ... + p_(i-1), is
    below ``top_p``, so the most likely token always is. ``top_p = 1`` keeps every token.
    """
    logits = _check_logits(logits)
    return _top_p(logits, _check_top_p(top_p))


def _top_p(logits, p: float):
    if p == 1.0:
        return logits.copy()      # no rounding in the cumulative sum may drop a tail token
    xp = backend.xp
    order = _order(logits)                                      # (R, V)
    rows = xp.arange(logits.shape[0])[:, None]                  # (R, 1)
    ranked = logits[rows, order]                                # (R, V) descending
    mass = xp.cumsum(_probabilities(ranked), axis=-1)           # (R, V) inclusive, float64
    mass_before = xp.concatenate([xp.zeros_like(mass[:, :1]), mass[:, :-1]], axis=-1)
    drop = mass_before >= p                                     # (R, V); column 0 never drops
    out = xp.empty_like(logits)
    out[rows, order] = xp.where(drop, -xp.inf, ranked)          # back to token order
    return out


def check_settings(vocab: int, *, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None) -> None:
    """Raise the error :func:`sample` would raise for these settings, without any array."""
    _check_temperature(temperature)
    if top_k is not None:
        _check_top_k(top_k, vocab)
    if top_p is not None:
        _check_top_p(top_p)


def filter_logits(logits, *, temperature: float = 1.0, top_k: int | None = None,
                  top_p: float | None = None):
    """(R, V) float64 logits z' that :func:`sample` draws from: ``z / T``, then top-k, then top-p
    (each filter only when given)."""
    return _filter(_check_logits(logits), temperature, top_k, top_p)


def _filter(logits, temperature, top_k, top_p):
    check_settings(logits.shape[1], temperature=temperature, top_k=top_k, top_p=top_p)
    scaled = logits.astype(backend.xp.float64) / float(temperature)   # float64: no overflow at small T
    if top_k is not None and top_k < logits.shape[1]:
        scaled = _top_k(scaled, top_k)
    if top_p is not None:
        scaled = _top_p(scaled, top_p)
    return scaled


def probabilities(logits):
    """softmax(z) (R, V) in float64: ``exp(z - max z) / sum exp(z - max z)`` per row."""
    return _probabilities(_check_logits(logits))


def _probabilities(logits):
    xp = backend.xp
    shifted = logits.astype(xp.float64) - logits.max(axis=-1, keepdims=True)
    weights = xp.exp(shifted)                     # (R, V); exp(-inf) = 0 for filtered tokens
    return weights / weights.sum(axis=-1, keepdims=True)


def greedy(logits):
    """(R,) int64 id of each row's largest logit (the lower id among equals): the limit of
    :func:`sample` as the temperature goes to 0."""
    logits = _check_logits(logits)
    return backend.xp.argmax(logits, axis=-1).astype(backend.xp.int64)


def draw(logits, generator):
    """(R,) int64 token ids, row r drawn from softmax(logits[r]) with one uniform number from
    ``generator`` (a generator of the active backend, e.g. ``backend.rng(seed, step)``)."""
    return _draw(_check_logits(logits), generator)


def _draw(logits, generator):
    q = _probabilities(logits)                    # (R, V)
    xp = backend.xp
    cdf = xp.cumsum(q, axis=-1)                   # (R, V)
    cdf /= cdf[:, -1:]                            # the last entry exactly 1, whatever the rounding
    u = 1.0 - generator.random((q.shape[0], 1))   # (R, 1) in (0, 1]: never below a zero-mass start
    return (cdf < u).sum(axis=-1).astype(xp.int64)   # the first i with cdf_i >= u


def sample(logits, generator, *, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None):
    """(R,) int64 next-token ids drawn from :func:`filter_logits` (temperature, top-k, top-p)."""
    return _draw(_filter(_check_logits(logits), temperature, top_k, top_p), generator)


def draw_next(logits, generator, *, greedy: bool = False, temperature: float = 1.0,
              top_k: int | None = None, top_p: float | None = None):
    """``(ids, finite)``: :func:`sample` (or :func:`greedy`) without waiting for the device.

    ids (R,) int64 and finite, a 0-d bool, whether every row had a finite largest logit: the
    answer of the check the other functions make at their entry. A caller generating token by
    token copies both to the host in one transfer (``backend.to_host_together``), and raises
    :class:`NonFiniteLogits` when ``finite`` is False: one wait for the device per token."""
    logits = _check_logits(logits, finite=False)
    if greedy:
        ids = backend.xp.argmax(logits, axis=-1).astype(backend.xp.int64)
    else:
        ids = _draw(_filter(logits, temperature, top_k, top_p), generator)
    return ids, _finite_rows(logits)
