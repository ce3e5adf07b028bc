"""Decoder layer and stack (paper, section 3.1).

Each of the N identical layers has three sub-layers, each wrapped in a residual connection with
layer normalization (see residual.py):
    x = Residual(x, SelfAttention(x, mask = future positions and padded target keys))
    x = Residual(x, CrossAttention(x, memory, mask = padded source keys))
    x = Residual(x, FeedForward(x))
With pre-LN a final layer normalization ("ln") follows the stack.

Parameter names, relative to the stack ("dec." in the model):
    {i}.self_attn.{w_qkv,b_qkv,w_o,b_o}                {i}.ln1.{gamma,beta}
    {i}.cross_attn.{w_q,b_q,w_kv,b_kv,w_o,b_o}         {i}.ln2.{gamma,beta}
    {i}.ff.{w1,b1,w2,b2}                               {i}.ln3.{gamma,beta}
    ln.{gamma,beta} (pre-LN only)

Backward: as the encoder's, plus the encoder output ("memory") feeds every layer's
cross-attention, so its gradient is the sum over the N layers.
"""

from __future__ import annotations

from minitfm.layers import attention, feedforward, layernorm, prefixed, residual, subdict


def layer_forward(x, memory, p, self_mask, cross_mask, cfg, rng):
    """x (B, T, d_model), memory (B, S, d_model)."""
    sa, ca, ff = subdict(p, "self_attn."), subdict(p, "cross_attn."), subdict(p, "ff.")
    x, c1 = residual.forward(
        x, lambda h: attention.self_forward(h, sa, self_mask, cfg.n_heads),
        subdict(p, "ln1."), cfg.dropout, rng, cfg.pre_ln)
    x, c2 = residual.forward(
        x, lambda h: attention.cross_forward(h, memory, ca, cross_mask, cfg.n_heads),
        subdict(p, "ln2."), cfg.dropout, rng, cfg.pre_ln)
    x, c3 = residual.forward(
        x, lambda h: feedforward.forward(h, ff["w1"], ff["b1"], ff["w2"], ff["b2"]),
        subdict(p, "ln3."), cfg.dropout, rng, cfg.pre_ln)
    return x, (c1, c2, c3)


def layer_backward(dy, cache):
    """Return ``(dx, dmemory, grads)``."""
    c1, c2, c3 = cache
    dx, g_ln3, g_ff = residual.backward(dy, c3, feedforward.backward)
    dx, g_ln2, dmemory, g_ca = residual.backward(dx, c2, attention.cross_backward)
    dx, g_ln1, g_sa = residual.backward(dx, c1, attention.self_backward)
    grads = {**prefixed(g_sa, "self_attn."), **prefixed(g_ln1, "ln1."),
             **prefixed(g_ca, "cross_attn."), **prefixed(g_ln2, "ln2."),
             **prefixed(g_ff, "ff."), **prefixed(g_ln3, "ln3.")}
    return dx, dmemory, grads


def stack_forward(x, memory, p, self_mask, cross_mask, cfg, rng):
    caches = []
    for i in range(cfg.n_layers):
        x, c = layer_forward(x, memory, subdict(p, f"{i}."), self_mask, cross_mask, cfg, rng)
        caches.append(c)
    c_ln = None
    if cfg.pre_ln:
        x, c_ln = layernorm.forward(x, p["ln.gamma"], p["ln.beta"])
    return x, (caches, c_ln)


def stack_backward(dy, cache):
    """Return ``(dx, dmemory, grads)``; dmemory sums the cross-attention gradients of all layers."""
    caches, c_ln = cache
    grads = {}
    if c_ln is not None:
        dy, g = layernorm.backward(dy, c_ln)
        grads.update(prefixed(g, "ln."))
    dmemory = None
    for i in reversed(range(len(caches))):
        dy, dm, g = layer_backward(dy, caches[i])
        dmemory = dm if dmemory is None else dmemory + dm
        grads.update(prefixed(g, f"{i}."))
    return dy, dmemory, grads
