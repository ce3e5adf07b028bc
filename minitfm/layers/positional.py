"""Sinusoidal positional encoding (paper, section 3.5).

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

Forward:  y[b, t] = x[b, t] + PE(offset + t)      x, y (B, T, d_model)
Backward: dL/dx = dL/dy                            PE is a constant, so the sum passes dy through.

No parameters and nothing to cache (the cache is None). ``offset`` lets incremental decoding
encode position t alone (``model.embed(..., offset=t)``).
"""

from __future__ import annotations

from minitfm import backend


def encoding(length, d_model, dtype, offset=0):
    """The (length, d_model) matrix of PE rows for positions offset .. offset+length-1."""
    xp = backend.xp
    pos = xp.arange(offset, offset + length, dtype=xp.float64)[:, None]        # (T, 1)
    two_i = xp.arange(0, d_model, 2, dtype=xp.float64)[None, :]                # (1, ceil(d/2))
    angle = pos / xp.power(10000.0, two_i / d_model)                           # (T, ceil(d/2))
    pe = xp.empty((length, d_model), dtype=xp.float64)
    pe[:, 0::2] = xp.sin(angle)
    pe[:, 1::2] = xp.cos(angle[:, : d_model // 2])
    return pe.astype(dtype, copy=False)


_tables: dict = {}      # (backend, d_model, dtype) -> the rows computed so far, on the device


def table(length, d_model, dtype):
    """PE rows 0 .. length-1, computed once (in float64, then cast) and kept: a constant of the
    model, so a training step or a decoding step only reads it."""
    key = (backend.name, d_model, backend.xp.dtype(dtype).str)
    rows = _tables.get(key)
    if rows is None or rows.shape[0] < length:
        rows = encoding(max(length, 2 * (0 if rows is None else rows.shape[0]), 64), d_model,
                        dtype)
        _tables[key] = rows
    return rows[:length]


def forward(x, offset=0):
    """Return ``(x + PE, None)``; there is nothing to cache."""
    return x + table(offset + x.shape[-2], x.shape[-1], x.dtype)[offset:], None


def backward(dy, cache):
    """Return ``(dy, {})``: the gradient passes through unchanged."""
    return dy, {}
