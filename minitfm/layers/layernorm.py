"""Layer normalization (Ba et al., 2016), over the last axis of size D.

Forward
    mu   = mean(x)                    var = mean((x - mu)^2)
    rstd = 1 / sqrt(var + eps)        xhat = (x - mu) * rstd
    y    = gamma * xhat + beta

Backward (per row; g = dL/dxhat = dy * gamma)
    dL/dgamma = sum_rows dy * xhat
    dL/dbeta  = sum_rows dy
    dL/dx     = rstd * (g - mean(g) - xhat * mean(g * xhat))
       term 1: g                      the direct path through xhat
       term 2: -mean(g)               through mu (every x_i shifts the mean by 1/D)
       term 3: -xhat * mean(g * xhat) through var (d var / d x_i = 2 (x_i - mu) / D)
       final scale: rstd

Parameters: "gamma" (D,) and "beta" (D,).

Its fast paths: ``minitfm/speed/layernorm.py``.
"""

from __future__ import annotations

from typing import NamedTuple

from minitfm import backend

EPS = 1e-5


class Cache(NamedTuple):
    xhat: object            # (..., D) the normalised input
    rstd: object            # (..., 1) 1 / sqrt(var + eps)
    gamma: object           # (D,)


def param_shapes(d: int) -> dict[str, tuple[int, ...]]:
    return {"gamma": (d,), "beta": (d,)}


def forward(x, p, eps=EPS):
    """Return ``(y, cache)`` with the statistics needed by the backward pass."""
    mu = x.mean(axis=-1, keepdims=True)                             # (..., 1)
    xhat = x - mu                                                   # (..., D), centred
    var = (xhat * xhat).mean(axis=-1, keepdims=True)                # (..., 1) mean((x - mu)^2)
    rstd = 1.0 / backend.xp.sqrt(var + eps)                         # (..., 1)
    xhat *= rstd                                                    # (x - mu) * rstd
    y = xhat * p["gamma"]
    y += p["beta"]
    return y, Cache(xhat, rstd, p["gamma"])


def backward(dy, cache: Cache, out=None):
    """Return ``(dx, {"gamma": dgamma, "beta": dbeta})``."""
    xhat, rstd, gamma = cache.xhat, cache.rstd, cache.gamma
    xp = backend.xp
    d = xhat.shape[-1]
    dgamma = xp.einsum("ni,ni->i", dy.reshape(-1, d), xhat.reshape(-1, d))     # sum_rows dy * xhat
    if out is not None:            # CuPy's einsum takes no out= (only dtype and optimize)
        out["gamma"][...] = dgamma
        dgamma = out["gamma"]
    dbeta = dy.reshape(-1, d).sum(axis=0, out=None if out is None else out["beta"])
    g = dy * gamma                                                              # term 1
    mean_g = g.mean(axis=-1, keepdims=True)
    mean_gx = xp.einsum("...i,...i->...", g, xhat)[..., None] / d
    g -= mean_g                                                                 # term 2
    g -= xhat * mean_gx                                                         # term 3
    g *= rstd                                                                   # final scale
    return g, {"gamma": dgamma, "beta": dbeta}
