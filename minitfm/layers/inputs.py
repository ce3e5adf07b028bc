"""The input layer of both models: token embedding times sqrt(d_model), plus the positions, then
dropout (paper, sections 3.4, 3.5 and 5.4); word dropout optionally (not in the paper).

Forward
    e = E[ids] * sqrt(d_model)                  embedding.py; ids (B, T) -> e (B, T, d)
    e = e * w / (1 - p_w)                       word dropout: w (B, T, 1) ~ Bernoulli(1 - p_w),
                                                a whole token's embedding dropped, its position
                                                kept (Gal and Ghahramani, 2016; Sennrich and
                                                Zhang, 2019); only where p_w > 0
    x = e + P[offset : offset + T]              positional.py: the sinusoids, or a learned table
    y = Dropout(x)                              dropout.py ("we apply dropout to the sums of the
                                                embeddings and the positional encodings")
``offset`` is the position of ids[:, 0]: an incremental decoding step feeds position t alone (or,
with the sinusoids, ``positional.Positions``: rows decoded at different positions).

Backward, in reverse order
    dx = Dropout'(dy);  dP[offset : offset + T] = sum over the batch of dx (learned table only);
    de = dx * w / (1 - p_w) (word dropout: the positions' gradient is not masked, the words' is);
    dE = scatter-add of de * sqrt(d_model) over the rows of ids. The ids get no gradient.

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
    words: dropout.Cache | None = None             # word dropout: keep (B, T, 1) and its scale


def param_shapes(vocab: int, d_model: int, max_len: int | None = None) -> dict:
    """"table" (V, d), and "positions" (L, d) when ``max_len`` is given (learned positions)."""
    shapes = {"table": embedding.param_shapes(vocab, d_model)["table"]}
    if max_len is not None:
        shapes["positions"] = positional.learned_param_shapes(max_len, d_model)["table"]
    return shapes


def forward(ids, p, p_drop=0.0, rng=None, offset=0, p_word=0.0):
    """ids (B, T) -> ``(y (B, T, d), cache)``; dropout ``p_drop`` and word dropout ``p_word``
    drawn from ``rng`` (none when ``rng`` is None: evaluation, decoding). The word mask is drawn
    first, and only where ``p_word > 0``: without it, the masks are those of a run without."""
    x, c_emb = embedding.forward(ids, {"table": p["table"]})
    c_words = None
    if rng is not None and p_word:
        keep, scale = dropout.keep_mask(rng, (*ids.shape, 1), p_word)
        x = dropout.apply(x, keep, scale, out=x)            # x: the embedding's fresh copy
        c_words = dropout.Cache(keep, scale)
    c_pos = None
    if p.get("positions") is None:
        x, _ = positional.forward(x, offset)
    else:
        x, c_pos = positional.learned_forward(x, {"table": p["positions"]}, offset)
    x, c_drop = dropout.forward(x, p_drop, rng, inplace=True)
    return x, Cache(c_emb, c_pos, c_drop, c_words)


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
    if cache.words is not None:
        dx = dropout.apply(dx, cache.words.keep, cache.words.scale)
    _, g = embedding.backward(dx, cache.embedding, None if out is None else {"table": out["table"]})
    return None, {"table": g["table"], **grads}
