"""Token embedding, scaled by sqrt(d_model) (paper, section 3.4).

Forward
    y[n] = E[ids[n]] * s             E (V, d_model), ids (...) integer, y (..., d_model), s = sqrt(d_model)

Backward
    dL/dE[v] = s * sum_{n : ids[n] = v} dy[n]
    A token that occurs several times receives the sum of its rows' gradients: a scatter-add, not a
    plain assignment (``E_grad[ids] += ...`` would keep only one of the repeated rows). The ids get
    no gradient.

Parameters: "table" (V, d_model). The same matrix may be used several times in one step (source
embedding, target embedding, output projection); each use returns its own gradient and the model
adds them.

Its fast paths: ``minitfm/speed/embedding.py``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from minitfm import backend


class Cache(NamedTuple):
    ids: object             # (...) integer token ids
    shape: tuple            # (V, d_model) of the table
    dtype: object
    scale: float


def param_shapes(vocab: int, d_model: int) -> dict[str, tuple[int, ...]]:
    return {"table": (vocab, d_model)}


def forward(ids, p, scale=None):
    """Return ``(p["table"][ids] * scale, cache)``; ``scale`` defaults to sqrt(d_model)."""
    table = p["table"]
    if scale is None:
        scale = math.sqrt(table.shape[1])
    y = table[ids]                                  # (..., d_model), a fresh copy
    y *= scale
    return y, Cache(ids, table.shape, table.dtype, scale)


def backward(dy, cache: Cache, out=None):
    """Return ``(None, {"table": dtable})``: integer ids have no gradient.

    With ``out``, the rows are scatter-added into ``out["table"]`` (the one layer that adds into
    ``out`` rather than overwriting it: a table used several times sums its uses there).
    """
    dtable = backend.xp.zeros(cache.shape, dtype=cache.dtype) if out is None else out["table"]
    scaled = dy.reshape(-1, cache.shape[1]) * cache.scale   # (N, d_model), scaled before the sum
    backend.scatter_add(dtable, cache.ids.reshape(-1), scaled)
    return None, {"table": dtable}
