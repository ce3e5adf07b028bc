"""Scaled dot-product attention (paper, equation 1) and multi-head attention (section 3.2.2).

Scaled dot-product attention, per batch element and head
    S = Q K^T / sqrt(d_k) + M        Q (T, d_k), K (S, d_k), V (S, d_k), S (T, S)
    P = softmax(S)                   row-wise over the keys
    O = P V                          O (T, d_k)
M is an additive mask: 0 where a query may look, -1e9 where it may not (padded keys, and future
positions in the decoder's self-attention). exp(-1e9 - max) underflows to exactly 0, so a masked
key gets exactly zero weight and zero gradient.

Backward
    dV = P^T dO
    dP = dO V^T
    dS = P * (dP - rowsum(dP * P))   softmax Jacobian: dS_ij = P_ij (dP_ij - sum_k dP_ik P_ik)
    dQ = dS K / sqrt(d_k)
    dK = dS^T Q / sqrt(d_k)
    (M is a constant and gets no gradient.)

Multi-head attention
    MultiHead(Q, K, V) = Concat(head_1 .. head_h) W_O + b_O,  head_i = Attention(Q W_Q^i, K W_K^i, V W_V^i)
The per-head projections are fused into one matrix product: self-attention projects x once with
W_QKV = [W_Q | W_K | W_V] (d_model, 3 d_model); cross-attention projects the decoder state with
W_Q and the encoder output once with W_KV = [W_K | W_V] (d_model, 2 d_model). Each head reads
its d_k = d_model / h columns of those products.
"""

from __future__ import annotations

import math

from minitfm import backend
from minitfm.layers import linear

MASKED = -1e9


# ---- scaled dot-product attention ------------------------------------------------------------

def sdpa_forward(q, k, v, mask=None):
    """q (B, H, T, d_k), k and v (B, H, S, d_k), mask broadcastable to (B, H, T, S)."""
    xp = backend.xp
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = q @ k.swapaxes(-1, -2)                      # (B, H, T, S)
    s *= scale
    if mask is not None:
        s += mask
    s -= s.max(axis=-1, keepdims=True)              # softmax, in place on the scores
    p = xp.exp(s, out=s)
    p /= p.sum(axis=-1, keepdims=True)              # (B, H, T, S)
    o = p @ v                                       # (B, H, T, d_k)
    return o, (q, k, v, p, scale)


def sdpa_backward(do, cache):
    """Return ``(dq, dk, dv)``."""
    q, k, v, p, scale = cache
    dv = p.swapaxes(-1, -2) @ do                    # (B, H, S, d_k)
    dp = do @ v.swapaxes(-1, -2)                    # (B, H, T, S)
    dp -= (dp * p).sum(axis=-1, keepdims=True)
    ds = dp
    ds *= p                                         # dS = P * (dP - rowsum(dP * P))
    ds *= scale                                     # fold 1/sqrt(d_k) in once for dQ and dK
    dq = ds @ k                                     # (B, H, T, d_k)
    dk = ds.swapaxes(-1, -2) @ q                    # (B, H, S, d_k)
    return dq, dk, dv


# ---- head split / merge ----------------------------------------------------------------------

def split_heads(x, n_parts, n_heads):
    """(B, T, n_parts * d_model) -> n_parts arrays (B, H, T, d_k)."""
    b, t, width = x.shape
    d_k = width // (n_parts * n_heads)
    x = x.reshape(b, t, n_parts, n_heads, d_k).transpose(2, 0, 3, 1, 4)   # (n_parts, B, H, T, d_k)
    return tuple(x[i] for i in range(n_parts))


def merge_heads(*heads):
    """n_parts arrays (B, H, T, d_k) -> (B, T, n_parts * H * d_k); inverse of split_heads."""
    b, h, t, d_k = heads[0].shape
    out = backend.xp.empty((b, t, len(heads), h, d_k), dtype=heads[0].dtype)
    for i, x in enumerate(heads):
        out[:, :, i] = x.transpose(0, 2, 1, 3)     # one copy per part, straight into place
    return out.reshape(b, t, len(heads) * h * d_k)


# ---- multi-head self-attention -------------------------------------------------------------

def self_forward(x, p, mask, n_heads):
    """x (B, T, d_model); p has "w_qkv" (d, 3d), "b_qkv", "w_o" (d, d), "b_o"."""
    qkv, c_qkv = linear.forward(x, p["w_qkv"], p["b_qkv"])                # (B, T, 3d)
    q, k, v = split_heads(qkv, 3, n_heads)                               # (B, H, T, d_k) each
    o, c_att = sdpa_forward(q, k, v, mask)
    y, c_o = linear.forward(merge_heads(o), p["w_o"], p["b_o"])          # (B, T, d)
    return y, (c_qkv, c_att, c_o, n_heads)


def self_backward(dy, cache):
    """Return ``(dx, {"w_qkv", "b_qkv", "w_o", "b_o"})``."""
    c_qkv, c_att, c_o, n_heads = cache
    do, g_o = linear.backward(dy, c_o)
    dq, dk, dv = sdpa_backward(*split_heads(do, 1, n_heads), c_att)
    dx, g_qkv = linear.backward(merge_heads(dq, dk, dv), c_qkv)
    return dx, {"w_qkv": g_qkv["w"], "b_qkv": g_qkv["b"], "w_o": g_o["w"], "b_o": g_o["b"]}


# ---- multi-head cross-attention (decoder queries, encoder keys and values) -----------------

def cross_forward(x, memory, p, mask, n_heads):
    """x (B, T, d) decoder state, memory (B, S, d) encoder output.

    p has "w_q" (d, d), "b_q", "w_kv" (d, 2d), "b_kv", "w_o", "b_o".
    """
    qp, c_q = linear.forward(x, p["w_q"], p["b_q"])                      # (B, T, d)
    kv, c_kv = linear.forward(memory, p["w_kv"], p["b_kv"])              # (B, S, 2d)
    (q,) = split_heads(qp, 1, n_heads)
    k, v = split_heads(kv, 2, n_heads)
    o, c_att = sdpa_forward(q, k, v, mask)
    y, c_o = linear.forward(merge_heads(o), p["w_o"], p["b_o"])
    return y, (c_q, c_kv, c_att, c_o, n_heads)


def cross_backward(dy, cache):
    """Return ``(dx, dmemory, {"w_q", "b_q", "w_kv", "b_kv", "w_o", "b_o"})``."""
    c_q, c_kv, c_att, c_o, n_heads = cache
    do, g_o = linear.backward(dy, c_o)
    dq, dk, dv = sdpa_backward(*split_heads(do, 1, n_heads), c_att)
    dx, g_q = linear.backward(merge_heads(dq), c_q)
    dmemory, g_kv = linear.backward(merge_heads(dk, dv), c_kv)
    grads = {"w_q": g_q["w"], "b_q": g_q["b"], "w_kv": g_kv["w"], "b_kv": g_kv["b"],
             "w_o": g_o["w"], "b_o": g_o["b"]}
    return dx, dmemory, grads
