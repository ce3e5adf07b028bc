"""Token embedding, scaled by sqrt(d_model) (paper, section 3.4).

Forward
    y[n] = E[ids[n]] * s             E (V, d_model), ids (...) integer, y (..., d_model), s = sqrt(d_model)

Backward
    dL/dE[v] = s * sum_{n : ids[n] = v} dy[n]
    A token that occurs several times receives the sum of its rows' gradients: a scatter-add, not a
    plain assignment (``E_grad[ids] += ...`` would keep only one of the repeated rows). The ids get
    no gradient.

The same matrix may be used several times in one step (source embedding, target embedding, output
projection); each use returns its own gradient and the model adds them.
"""

from __future__ import annotations

import math

from minitfm import backend


def forward(ids, table, scale=None):
    """Return ``(table[ids] * scale, cache)``; ``scale`` defaults to sqrt(d_model)."""
    d_model = table.shape[1]
    if scale is None:
        scale = math.sqrt(d_model)
    y = table[ids]                                  # (..., d_model), a fresh copy
    y *= scale
    return y, (ids, table.shape, table.dtype, scale)


def backward(dy, cache):
    """Return ``(None, {"table": dtable})``: integer ids have no gradient."""
    ids, shape, dtype, scale = cache
    xp = backend.xp
    dtable = xp.zeros(shape, dtype=dtype)           # (V, d_model)
    backend.scatter_add(dtable, ids.reshape(-1), dy.reshape(-1, shape[1]))
    dtable *= scale
    return None, {"table": dtable}
