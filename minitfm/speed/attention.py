"""The fast paths of scaled dot-product attention (``minitfm/layers/attention.py``), chosen per
call by :mod:`minitfm.speed.policy`; the plain functions are their twins.

On CuPy the softmax is one kernel each way (``speed/softmax.py``); on NumPy (``--kernels
fused``, the default there) the scaled dot-product attention runs on blocks of the batch on the
worker's threads (:mod:`minitfm.speed.rows`), each block the plain code's operations, the
softmax's compiled loops where Numba is installed (within float32 rounding), else its plain lines
(the same bits).
"""

from __future__ import annotations

import math

from minitfm import backend
from minitfm.layers import attention, softmax
from minitfm.speed import fused, policy, rows


# ---- row passes (CPU) ------------------------------------------------------------------------

@policy.fast_path(attention.sdpa_forward)
def choose_forward(q, k, v, mask=None, o_out=None, p_drop=0.0, rng=None):
    """The row pass on NumPy (--kernels fused), blocks of the batch: 4-D, more than one query, no
    attention dropout."""
    dropping = p_drop != 0.0 and rng is not None
    return rows_forward if _row_blocks(q, k, dropping) else None


@policy.fast_path(attention.sdpa_backward)
def choose_backward(do, cache: attention.SdpaCache, dq_out=None, dk_out=None, dv_out=None):
    """The row pass on NumPy (--kernels fused), as the forward pass chose it."""
    dropping = cache.dropout is not None
    return rows_backward if _row_blocks(cache.q, cache.k, dropping) else None


def _row_blocks(q, k, dropping: bool) -> list[slice] | None:
    """The blocks of the batch the row passes below run on, or None: the plain code for a
    decoding step's one query a row (too little to share) and attention dropout
    (one stream draws its mask); an empty batch has no blocks, and runs the plain code too."""
    if dropping or q.ndim != 4 or q.shape[2] == 1 or not rows.active(q, k) or fused.active(q):
        return None
    return _blocks(q, k)


def _blocks(q, k) -> list[slice]:
    """The blocks of the batch, sized by an element's arrays in the backward pass (the larger)."""
    (b, h, t, d_k), s = q.shape, k.shape[2]     # P, dP (T, S); q, dO, dQ; k, v, dK, dV (S, d_k)
    return rows.blocks(b, h * (2 * t * s + (3 * t + 4 * s) * d_k) * q.itemsize)


def rows_forward(q, k, v, mask=None, o_out=None, p_drop=0.0, rng=None):
    """``sdpa_forward`` without dropout (``p_drop``, ``rng``: chosen only where none is drawn)
    on blocks of the batch shared among the worker's threads (``minitfm.speed.rows``), a block's scores
    in a core's cache from Q K^T to P V (NumPy alone runs on one core, sweeping all (B, H, T, S)
    scores): the same operations per element, the same bits."""
    xp, scale = backend.xp, 1.0 / math.sqrt(q.shape[-1])
    p = xp.empty(q.shape[:3] + k.shape[2:3], dtype=q.dtype)     # (B, H, T, S), a slice a block
    o = xp.empty(q.shape, dtype=q.dtype) if o_out is None else o_out     # (B, H, T, d_k)
    own_mask = mask is not None and mask.ndim == 4 and mask.shape[0] > 1     # one per element
    soft = policy.path(softmax.forward, p, scale, mask)   # asked here: on a block, the plain code

    def block(r):
        xp.matmul(q[r], k[r].swapaxes(-1, -2), out=p[r])                # the scores, in P
        soft(p[r], scale, mask[r] if own_mask else mask)
        xp.matmul(p[r], v[r], out=o[r])
    rows.run(block, _blocks(q, k))
    return o, attention.SdpaCache(q, k, v, p, p, None, scale)


def rows_backward(do, cache: attention.SdpaCache, dq_out=None, dk_out=None, dv_out=None):
    """``sdpa_backward`` without dropout on blocks of the batch, as ``rows_forward``."""
    xp, q, k, v, p = backend.xp, cache.q, cache.k, cache.v, cache.p
    dq, dk, dv = (xp.empty(a.shape, dtype=a.dtype) if out is None else out
                  for a, out in ((q, dq_out), (k, dk_out), (v, dv_out)))
    # asked here (on a block the plain code is chosen); dP is made of P's shape and type
    soft = policy.path(softmax.backward, p, p, cache.scale)

    def block(r):
        xp.matmul(p[r].swapaxes(-1, -2), do[r], out=dv[r])              # (b, H, S, d_k)
        ds = soft(do[r] @ v[r].swapaxes(-1, -2), p[r], cache.scale)      # (b, H, T, S)
        xp.matmul(ds, k[r], out=dq[r])                                  # (b, H, T, d_k)
        xp.matmul(ds.swapaxes(-1, -2), q[r], out=dk[r])                 # (b, H, S, d_k)
    rows.run(block, _blocks(q, k))
    return dq, dk, dv, {}
