"""Positional encodings: the paper's sinusoids (section 3.5), and a learned table as an option.

Sinusoidal (no parameters)

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

Forward:  y[b, t] = x[b, t] + PE(offset + t)      x, y (B, T, d_model)
Backward: dL/dx = dL/dy                            PE is a constant, so the sum passes dy through.
Nothing to cache (the cache is None).

Learned (section 3.5: "We also experimented with using learned positional embeddings instead,
and found that the two versions produced nearly identical results"; GPT's choice)

Forward:  y[b, t] = x[b, t] + P[offset + t]        P (L, d_model) a parameter, "table"
Backward: dL/dx = dL/dy                            the sum passes dy through, as above
          dL/dP[offset + t] = sum_b dL/dy[b, t]    every batch row adds to the same position's row;
          dL/dP[s] = 0 for rows s outside offset .. offset+T-1 (not used by this input)

``offset`` lets incremental decoding encode position t alone (``model.embed(..., offset=t)``).
"""

from __future__ import annotations

from typing import NamedTuple

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


_tables: dict = {}      # (array module, d_model, dtype) -> the rows computed so far, on the device


def table(length, d_model, dtype):
    """PE rows 0 .. length-1, computed once (in float64, then cast) and kept: a constant of the
    model, so a training step or a decoding step only reads it."""
    key = (id(backend.xp), d_model, backend.xp.dtype(dtype).str)   # arrays of this module only
    rows = _tables.get(key)
    if rows is None or rows.shape[0] < length:
        rows = encoding(max(length, 2 * (0 if rows is None else rows.shape[0]), 64), d_model,
                        dtype)
        _tables[key] = rows
    return rows[:length]


class Positions(NamedTuple):
    """Rows decoded at different positions, in runs: row r at position ``at[r]``."""
    at: object      # (R,) integer positions, on the device
    runs: tuple     # (first row, end row, position) of each run of rows at one position

    @property
    def end(self) -> int:
        """One past the largest position."""
        return max(u for _, _, u in self.runs) + 1


def forward(x, offset=0):
    """Return ``(x + PE, None)``; there is nothing to cache. ``offset`` may be
    :class:`Positions`, a position for each row of x (R, 1, d)."""
    if isinstance(offset, Positions):
        return x + table(offset.end, x.shape[-1], x.dtype)[offset.at][:, None], None
    return x + table(offset + x.shape[-2], x.shape[-1], x.dtype)[offset:], None


def backward(dy, cache):
    """Return ``(dy, {})``: the gradient passes through unchanged."""
    return dy, {}


# ---- learned positions ------------------------------------------------------------------------

class LearnedCache(NamedTuple):
    offset: int             # the position of x[:, 0]
    shape: tuple            # (L, d_model) of the table
    dtype: object


def learned_param_shapes(max_len: int, d_model: int) -> dict[str, tuple[int, ...]]:
    return {"table": (max_len, d_model)}


def learned_forward(x, p, offset=0):
    """x (..., T, d_model) -> ``(x + P[offset : offset + T], cache)``; p has "table" (L, d)."""
    positions = p["table"]
    length = x.shape[-2]
    if offset < 0 or offset + length > positions.shape[0]:
        raise ValueError(f"positions {offset} .. {offset + length - 1} are outside the learned "
                         f"table of {positions.shape[0]} positions")
    y = x + positions[offset:offset + length]
    return y, LearnedCache(offset, positions.shape, positions.dtype)


def learned_backward(dy, cache: LearnedCache, out=None):
    """Return ``(dy, {"table": dtable})``: dy passes through; each used row sums over the batch.

    With ``out``, the gradient is written into ``out["table"]`` (overwriting it)."""
    xp = backend.xp
    length = dy.shape[-2]
    if out is None:
        dtable = xp.zeros(cache.shape, dtype=cache.dtype)                    # (L, d)
    else:
        dtable = out["table"]
        dtable[...] = 0.0
    dtable[cache.offset:cache.offset + length] = dy.reshape(-1, length, dy.shape[-1]).sum(axis=0)
    return dy, {"table": dtable}
