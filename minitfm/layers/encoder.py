"""Encoder layer and stack (paper, section 3.1).

Each of the N identical layers has two sub-layers, each wrapped in a residual connection with
layer normalization (see residual.py):
    x = Residual(x, SelfAttention(x, mask = padded source keys))
    x = Residual(x, FeedForward(x))
With pre-LN a final layer normalization ("ln") follows the stack.

Parameter names, relative to the stack ("enc." in the model):
    {i}.attn.{w_qkv,b_qkv,w_o,b_o}   {i}.ln1.{gamma,beta}
    {i}.ff.{w1,b1,w2,b2}             {i}.ln2.{gamma,beta}       ln.{gamma,beta} (pre-LN only)

Backward: the layers in reverse order, each sub-layer's residual backward in reverse order; the
gradient of every parameter is collected under its full name.
"""

from __future__ import annotations

from minitfm.layers import attention, feedforward, layernorm, prefixed, residual, subdict


def layer_forward(x, p, mask, cfg, rng):
    """x (B, S, d_model); ``cfg`` supplies n_heads, dropout, pre_ln."""
    attn, ff = subdict(p, "attn."), subdict(p, "ff.")
    x, c1 = residual.forward(
        x, lambda h: attention.self_forward(h, attn, mask, cfg.n_heads),
        subdict(p, "ln1."), cfg.dropout, rng, cfg.pre_ln)
    x, c2 = residual.forward(
        x, lambda h: feedforward.forward(h, ff["w1"], ff["b1"], ff["w2"], ff["b2"]),
        subdict(p, "ln2."), cfg.dropout, rng, cfg.pre_ln)
    return x, (c1, c2)


def layer_backward(dy, cache):
    c1, c2 = cache
    dx, g_ln2, g_ff = residual.backward(dy, c2, feedforward.backward)
    dx, g_ln1, g_attn = residual.backward(dx, c1, attention.self_backward)
    grads = {**prefixed(g_attn, "attn."), **prefixed(g_ln1, "ln1."),
             **prefixed(g_ff, "ff."), **prefixed(g_ln2, "ln2.")}
    return dx, grads


def stack_forward(x, p, mask, cfg, rng):
    """Run ``cfg.n_layers`` layers; ``p`` holds the stack's parameters (names as above)."""
    caches = []
    for i in range(cfg.n_layers):
        x, c = layer_forward(x, subdict(p, f"{i}."), mask, cfg, rng)
        caches.append(c)
    c_ln = None
    if cfg.pre_ln:
        x, c_ln = layernorm.forward(x, p["ln.gamma"], p["ln.beta"])
    return x, (caches, c_ln)


def stack_backward(dy, cache):
    caches, c_ln = cache
    grads = {}
    if c_ln is not None:
        dy, g = layernorm.backward(dy, c_ln)
        grads.update(prefixed(g, "ln."))
    for i in reversed(range(len(caches))):
        dy, g = layer_backward(dy, caches[i])
        grads.update(prefixed(g, f"{i}."))
    return dy, grads
