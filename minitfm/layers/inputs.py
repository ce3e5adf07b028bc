"""The input layer of both models: token embedding times sqrt(d_model), plus the positions, then
dropout (paper, sections 3.4, 3.5 and 5.4).

Forward
    e = E[ids] * sqrt(d_model)                  embedding.py; ids (B, T) -> e (B, T, d)
    x = e + P[offset : offset + T]              positional.py: the sinusoids, or a learned table
    y = Dropout(x)                              dropout.py ("we apply dropout to the sums of the
                                                embeddings and the positional encodings")
``offset`` is the position of ids[:, 0]: an incremental decoding step feeds position t alone (or,
with the sinusoids, ``positional.Positions``: rows decoded at different positions).

Backward, the three in reverse order
    dx = Dropout'(dy);  dP[offset : offset + T] = sum over the batch of dx (learned table only);
    dE = scatter-add of dx * sqrt(d_model) over the rows of ids. The ids get no gradient.

Parameters: "table" (V, d) the token embedding, and "positions" (L, d) when the positions are a
learned table (without it, the sinusoids: a constant). With ``out``, the positions' gradient is
written into ``out["positions"]`` and the table's is *added* into ``out["table"]``: this layer's
backward is embedding.backward, the one layer that accumulates (see the contract in
layers/__init__.py).
"""

from __future__ import annotations

from typing import NamedTuple

from minitfm.layers import dropout, embedding, positional


class Cache(NamedTuple):
    embedding: embedding.Cache
    positions: positional.LearnedCache | None     # None: the sinusoids, a constant
    dropout: dropout.Cache | None


def param_shapes(vocab: int, d_model: int, max_len: int | None = None) -> dict:
    """"table" (V, d), and "positions" (L, d) when ``max_len`` is given (learned positions)."""
    shapes = {"table": embedding.param_shapes(vocab, d_model)["table"]}
    if max_len is not None:
        shapes["positions"] = positional.learned_param_shapes(max_len, d_model)["table"]
    return shapes


def forward(ids, p, p_drop=0.0, rng=None, offset=0):
    """ids (B, T) -> ``(y (B, T, d), cache)``; dropout ``p_drop`` drawn from ``rng`` (none when
    ``rng`` is None: evaluation, decoding)."""
    x, c_emb = embedding.forward(ids, {"table": p["table"]})
    c_pos = None
    if p.get("positions") is None:
        x, _ = positional.forward(x, offset)
    else:
        x, c_pos = positional.learned_forward(x, {"table": p["positions"]}, offset)
    x, c_drop = dropout.forward(x, p_drop, rng, inplace=True)
    return x, Cache(c_emb, c_pos, c_drop)


def backward(dy, cache: Cache, out=None):
    """Return ``(None, {"table"[, "positions"]})``: the ids have no gradient."""
    dx, _ = dropout.backward(dy, cache.dropout)
    grads = {}
    if cache.positions is None:
        dx, _ = positional.backward(dx, None)
    else:
        dx, g = positional.learned_backward(
            dx, cache.positions, None if out is None else {"table": out["positions"]})
        grads["positions"] = g["table"]
    _, g = embedding.backward(dx, cache.embedding, None if out is None else {"table": out["table"]})
    return None, {"table": g["table"], **grads}
