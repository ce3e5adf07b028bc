"""Scaled dot-product attention (paper, equation 1) and multi-head attention (section 3.2.2).

Scaled dot-product attention, per batch element and head
    S = Q K^T / sqrt(d_k) + M        Q (T, d_k), K (S, d_k), V (S, d_k), S (T, S)
    P = softmax(S)                   row-wise over the keys
    P'= dropout(P, p_att)            attention dropout (optional; not in the paper, see below)
    O = P' V                         O (T, d_k)
M is an additive mask: 0 where a query may look, -1e9 where it may not (padded keys, and future
positions in the decoder's self-attention: ``padding_mask``, ``causal_mask``). exp(-1e9 - max)
underflows to exactly 0, so a masked key gets exactly zero weight and zero gradient.

Backward (M is a constant and gets no gradient)
    dV = P'^T dO
    dP'= dO V^T
    dP = dP' * m / (1 - p_att)       the dropout's backward (dropout.py); dP = dP' without it
    dS = P * (dP - rowsum(dP * P))   softmax Jacobian: dS_ij = P_ij (dP_ij - sum_k dP_ik P_ik)
    dQ = dS K / sqrt(d_k),  dK = dS^T Q / sqrt(d_k)
Attention dropout (Tensor2Tensor's "attention_dropout", fairseq's "--attention-dropout"; off by
default), a regulariser for small corpora, zeroes whole weights: each query sees a random subset.

Multi-head attention
    MultiHead(Q, K, V) = Concat(head_1 .. head_h) W_O + b_O,  head_i = Attention(Q W_Q^i, K W_K^i, V W_V^i)
The heads' projections are one product each: W_QKV = [W_Q | W_K | W_V] over x (self-attention),
W_Q over the decoder state and W_KV = [W_K | W_V] over the encoder output (cross-attention); each
head reads its d_k = d_model / h columns. As row t of causal attention reads positions <= t alone,
``self_step`` and ``cross_step`` decode a position at a time, over the keys and values kept so far.

The softmax, its scale and mask, each way: ``softmax.py``.

Its fast paths: ``minitfm/speed/attention.py`` and ``minitfm/speed/softmax.py``.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from minitfm import backend
from minitfm.layers import dropout, linear, positional, softmax

MASKED = -1e9


# ---- masks: additive, MASKED where a query may not look, 0 elsewhere ---------------------------

def padding_mask(ids, pad_id, dtype):
    """ids (B, S) -> (B, 1, 1, S): MASKED at padded keys, 0 elsewhere."""
    return backend.xp.where(ids == pad_id, MASKED, 0.0).astype(dtype)[:, None, None, :]


_causal_masks: dict = {}     # (array module, T, dtype) -> mask, a constant made once


def causal_mask(length, dtype):
    """(1, 1, T, T): MASKED where the key's position is after the query's."""
    xp = backend.xp
    key = (id(xp), length, xp.dtype(dtype).str)      # arrays of this module only
    if key not in _causal_masks:
        future = xp.triu(xp.ones((length, length), dtype=bool), k=1)
        _causal_masks[key] = xp.where(future, MASKED, 0.0).astype(dtype)[None, None]
    return _causal_masks[key]


# ---- scaled dot-product attention ------------------------------------------------------------

class SdpaCache(NamedTuple):
    q: object               # (B, H, T, d_k)
    k: object               # (B, H, S, d_k)
    v: object               # (B, H, S, d_k)
    p: object               # (B, H, T, S) the attention probabilities, softmax(S)
    p_dropped: object       # P' = dropout(P), the weights of V (P itself without dropout)
    dropout: dropout.Cache | None   # the attention dropout's mask, or None
    scale: float            # 1 / sqrt(d_k)


def sdpa_forward(q, k, v, mask=None, o_out=None, p_drop=0.0, rng=None):
    """q (B, H, T, d_k), k and v (B, H, S, d_k), mask broadcastable to (B, H, T, S); ``o_out``:
    where to write O (B, H, T, d_k), e.g. a view of merged heads (``heads_buffer``); ``p_drop``:
    attention dropout, drawn from ``rng`` (none when ``rng`` is None: evaluation)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ k.swapaxes(-1, -2)                      # (B, H, T, S)
    p = softmax.forward(s, scale, mask)             # in place: s becomes P
    p_dropped, c_drop = dropout.forward(p, p_drop, rng)     # a new array: P stays for backward
    o = backend.xp.matmul(p_dropped, v, out=o_out)  # (B, H, T, d_k)
    return o, SdpaCache(q, k, v, p, p_dropped, c_drop, scale)


def sdpa_backward(do, cache: SdpaCache, dq_out=None, dk_out=None, dv_out=None):
    """Return ``(dq, dk, dv, {})`` (no parameters: the mask is a constant), written into
    ``dq_out``, ``dk_out``, ``dv_out`` when given, e.g. views of merged heads (``heads_buffer``)."""
    xp, q, k, v, p = backend.xp, cache.q, cache.k, cache.v, cache.p
    dv = xp.matmul(cache.p_dropped.swapaxes(-1, -2), do, out=dv_out)   # (B, H, S, d_k)
    dp = do @ v.swapaxes(-1, -2)                                # (B, H, T, S)
    if cache.dropout is not None:
        dp, _ = dropout.backward(dp, cache.dropout)
    ds = softmax.backward(dp, p, cache.scale)                   # (B, H, T, S)
    dq = xp.matmul(ds, k, out=dq_out)                           # (B, H, T, d_k)
    dk = xp.matmul(ds.swapaxes(-1, -2), q, out=dk_out)          # (B, H, S, d_k)
    return dq, dk, dv, {}


# ---- head split / merge, projections ---------------------------------------------------------

def split_heads(x, n_parts, n_heads):
    """(B, T, n_parts * d_model) -> n_parts arrays (B, H, T, d_k)."""
    b, t, width = x.shape
    d_k = width // (n_parts * n_heads)
    x = x.reshape(b, t, n_parts, n_heads, d_k).transpose(2, 0, 3, 1, 4)   # (n_parts, B, H, T, d_k)
    return tuple(x[i] for i in range(n_parts))


def heads_buffer(b, t, n_parts, n_heads, d_k, dtype):
    """An empty (B, T, n_parts * H * d_k) array and its ``split_heads`` views (B, H, T, d_k):
    results written straight into the views are merged heads, without a copy."""
    merged = backend.xp.empty((b, t, n_parts * n_heads * d_k), dtype=dtype)
    return merged, split_heads(merged, n_parts, n_heads)


def merge_heads(*heads):
    """n_parts arrays (B, H, T, d_k) -> (B, T, n_parts * H * d_k); inverse of split_heads."""
    b, h, t, d_k = heads[0].shape
    out = backend.xp.empty((b, t, len(heads), h, d_k), dtype=heads[0].dtype)
    for i, x in enumerate(heads):
        out[:, :, i] = x.transpose(0, 2, 1, 3)     # one copy per part, straight into place
    return out.reshape(b, t, len(heads) * h * d_k)


def _projection(d, name):
    """A linear layer's ``{"w", "b"}`` (shapes, gradients) as ``{"w_{name}", "b_{name}"}``."""
    return {f"{k}_{name}": a for k, a in d.items()}


def _projection_out(out, name):
    """The gradient arrays of projection ``name`` as a linear layer's ``{"w", "b"}``, or None."""
    return None if out is None else {"w": out[f"w_{name}"], "b": out[f"b_{name}"]}


# ---- multi-head self-attention -------------------------------------------------------------

class SelfCache(NamedTuple):
    qkv: linear.Cache       # x -> [Q | K | V]
    attention: SdpaCache
    out: linear.Cache       # merged heads -> y
    n_heads: int


def self_param_shapes(d_model: int) -> dict[str, tuple[int, ...]]:
    return {**_projection(linear.param_shapes(d_model, 3 * d_model), "qkv"),
            **_projection(linear.param_shapes(d_model, d_model), "o")}


def self_forward(x, p, mask, n_heads, p_drop=0.0, rng=None, add_bias=True):
    """x (B, T, d_model); p: "w_qkv" (d, 3d), "b_qkv", "w_o" (d, d), "b_o"; ``p_drop``, ``rng``:
    attention dropout (``sdpa_forward``); ``add_bias=False``: b_o left to the caller."""
    qkv, c_qkv = linear.forward(x, {"w": p["w_qkv"], "b": p["b_qkv"]})              # (B, T, 3d)
    q, k, v = split_heads(qkv, 3, n_heads)                               # (B, H, T, d_k) each
    merged, (o,) = heads_buffer(*x.shape[:2], 1, n_heads, q.shape[-1], x.dtype)
    _, c_att = sdpa_forward(q, k, v, mask, o, p_drop, rng)               # into merged (B, T, d)
    y, c_o = linear.forward(merged, {"w": p["w_o"], "b": p["b_o"]}, add_bias)       # (B, T, d)
    return y, SelfCache(c_qkv, c_att, c_o, n_heads)


def self_step(x, p, k_buf, v_buf, t, n_heads: int):
    """Row t alone of ``self_forward`` with a causal mask; return y (R, d). x (R, d_model) is
    position t of R rows; its key and value go into slot t of ``k_buf`` and ``v_buf`` (R, H, L,
    d_k), whose slots < t the earlier steps wrote (slots after t are never read: no mask). ``t``
    may be ``positional.Positions``: runs of rows at different positions, each a step of its own."""
    qkv, _ = linear.forward(x, {"w": p["w_qkv"], "b": p["b_qkv"]})                  # (R, 3d)
    q, k, v = split_heads(qkv[:, None], 3, n_heads)                      # (R, H, 1, d_k) each
    o = backend.xp.empty_like(q)                                         # (R, H, 1, d_k)
    for a, b, u in t.runs if isinstance(t, positional.Positions) else [(0, len(x), t)]:  # a:b at u
        k_buf[a:b, :, u], v_buf[a:b, :, u] = k[a:b, :, 0], v[a:b, :, 0]
        sdpa_forward(q[a:b], k_buf[a:b, :, :u + 1], v_buf[a:b, :, :u + 1], o_out=o[a:b])
    y, _ = linear.forward(merge_heads(o)[:, 0], {"w": p["w_o"], "b": p["b_o"]})     # (R, d)
    return y


def self_backward(dy, cache: SelfCache, out=None):
    """Return ``(dx, {"w_qkv", "b_qkv", "w_o", "b_o"})``."""
    do, g_o = linear.backward(dy, cache.out, _projection_out(out, "o"))
    q = cache.attention.q
    dqkv, (dq, dk, dv) = heads_buffer(*dy.shape[:2], 3, cache.n_heads, q.shape[-1], q.dtype)
    sdpa_backward(*split_heads(do, 1, cache.n_heads), cache.attention, dq, dk, dv)
    dx, g_qkv = linear.backward(dqkv, cache.qkv, _projection_out(out, "qkv"))
    return dx, {**_projection(g_qkv, "qkv"), **_projection(g_o, "o")}


# ---- multi-head cross-attention (decoder queries, encoder keys and values) -----------------

class CrossCache(NamedTuple):
    q: linear.Cache         # x -> Q
    kv: linear.Cache        # memory -> [K | V]
    attention: SdpaCache
    out: linear.Cache       # merged heads -> y
    n_heads: int


def cross_param_shapes(d_model: int) -> dict[str, tuple[int, ...]]:
    return {**_projection(linear.param_shapes(d_model, d_model), "q"),
            **_projection(linear.param_shapes(d_model, 2 * d_model), "kv"),
            **_projection(linear.param_shapes(d_model, d_model), "o")}


def cross_forward(x, memory, p, mask, n_heads, p_drop=0.0, rng=None, add_bias=True):
    """x (B, T, d) decoder state, memory (B, S, d) encoder output; p: "w_q" (d, d), "b_q",
    "w_kv" (d, 2d), "b_kv", "w_o" (d, d), "b_o"; ``p_drop``, ``rng``, ``add_bias``: as above."""
    qp, c_q = linear.forward(x, {"w": p["w_q"], "b": p["b_q"]})                     # (B, T, d)
    kv, c_kv = linear.forward(memory, {"w": p["w_kv"], "b": p["b_kv"]})             # (B, S, 2d)
    (q,) = split_heads(qp, 1, n_heads)
    k, v = split_heads(kv, 2, n_heads)
    merged, (o,) = heads_buffer(*x.shape[:2], 1, n_heads, q.shape[-1], x.dtype)
    _, c_att = sdpa_forward(q, k, v, mask, o, p_drop, rng)               # into merged (B, T, d)
    y, c_o = linear.forward(merged, {"w": p["w_o"], "b": p["b_o"]}, add_bias)
    return y, CrossCache(c_q, c_kv, c_att, c_o, n_heads)


def cross_kv(memory, p, n_heads):
    """The keys and values of ``cross_forward``, (B, H, S, d_k) each, from memory (B, S, d)."""
    kv, _ = linear.forward(memory, {"w": p["w_kv"], "b": p["b_kv"]})                # (B, S, 2d)
    return split_heads(kv, 2, n_heads)


def cross_step(x, p, k, v, mask, n_heads: int):
    """One position of ``cross_forward`` over keys and values from ``cross_kv``; return y (R, d).
    x (R, d_model), R = n * G: rows g*G .. g*G + G - 1 attend to row g of k and v (n, H, S, d_k)
    and of mask (n, 1, 1, S) (G = 1: a source per row). The G rows of a source are its queries,
    as the T positions of a sentence are in ``cross_forward``: one (G, d_k) @ (d_k, S) product
    per source and head, over keys and values shared, not copied."""
    n, h, s, d_k = k.shape
    qp, _ = linear.forward(x, {"w": p["w_q"], "b": p["b_q"]})                       # (R, d)
    q = qp.reshape(n, -1, h, d_k).swapaxes(1, 2)                         # (n, H, G, d_k) a view
    merged, (o,) = heads_buffer(n, q.shape[2], 1, h, d_k, x.dtype)      # (n, G, d), (n, H, G, d_k)
    sdpa_forward(q, k, v, mask, o)                                       # into merged
    y, _ = linear.forward(merged.reshape(x.shape[0], -1), {"w": p["w_o"], "b": p["b_o"]})
    return y


def cross_backward(dy, cache: CrossCache, out=None):
    """Return ``(dx, dmemory, {"w_q", "b_q", "w_kv", "b_kv", "w_o", "b_o"})``."""
    do, g_o = linear.backward(dy, cache.out, _projection_out(out, "o"))
    q, k = cache.attention.q, cache.attention.k
    b, h, t, d_k = q.shape
    dq_merged, (dq,) = heads_buffer(b, t, 1, h, d_k, q.dtype)
    dkv, (dk, dv) = heads_buffer(b, k.shape[2], 2, h, d_k, q.dtype)
    sdpa_backward(*split_heads(do, 1, cache.n_heads), cache.attention, dq, dk, dv)
    dx, g_q = linear.backward(dq_merged, cache.q, _projection_out(out, "q"))
    dmemory, g_kv = linear.backward(dkv, cache.kv, _projection_out(out, "kv"))
    return dx, dmemory, {**_projection(g_q, "q"), **_projection(g_kv, "kv"),
                         **_projection(g_o, "o")}
