"""Encoder layer and stack (paper, section 3.1).

Each of the N identical layers has two sub-layers, each wrapped in a residual connection with
layer normalization (see residual.py):
    x = Residual(x, SelfAttention(x, mask = padded source keys))
    x = Residual(x, FeedForward(x))
With pre-LN a final layer normalization ("ln") follows the stack.

Parameter names, relative to the stack ("enc." in the model), declared by ``param_shapes``:
    {i}.attn.{w_qkv,b_qkv,w_o,b_o}   {i}.ln1.{gamma,beta}
    {i}.ff.{w1,b1,w2,b2}             {i}.ln2.{gamma,beta}       ln.{gamma,beta} (pre-LN only)

Backward: the layers in reverse order, each sub-layer's residual backward in reverse order; the
gradient of every parameter is collected under its full name.
"""

from __future__ import annotations

from typing import NamedTuple

from minitfm.layers import (attention, feedforward, layernorm, out_part, prefixed, residual,
                            stack_param_shapes, subdict)


class LayerCache(NamedTuple):
    self_attn: residual.Cache       # its .sublayer is an attention.SelfCache
    ff: residual.Cache              # its .sublayer is a feedforward.Cache


class StackCache(NamedTuple):
    layers: list                    # one LayerCache per layer
    ln: layernorm.Cache | None      # the final LayerNorm (pre-LN only)


def layer_param_shapes(d_model: int, d_ff: int) -> dict[str, tuple[int, ...]]:
    return {**prefixed(attention.self_param_shapes(d_model), "attn."),
            **prefixed(layernorm.param_shapes(d_model), "ln1."),
            **prefixed(feedforward.param_shapes(d_model, d_ff), "ff."),
            **prefixed(layernorm.param_shapes(d_model), "ln2.")}


def param_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """The stack's parameters: "{i}." + the layer's, for each layer, then "ln." (pre-LN only)."""
    return stack_param_shapes(layer_param_shapes(cfg.d_model, cfg.d_ff), cfg.n_layers,
                              layernorm.param_shapes(cfg.d_model) if cfg.pre_ln else None)


def layer_forward(x, p, mask, cfg, rng):
    """x (B, S, d_model); ``cfg`` supplies n_heads, dropout, attention_dropout, relu_dropout,
    pre_ln."""
    attn, ff = subdict(p, "attn."), subdict(p, "ff.")
    x, c_attn = residual.forward(
        x, lambda h: attention.self_forward(h, attn, mask, cfg.n_heads, cfg.attention_dropout, rng),
        subdict(p, "ln1."), cfg.dropout, rng, cfg.pre_ln)
    x, c_ff = residual.forward(
        x, lambda h: feedforward.forward(h, ff, cfg.relu_dropout, rng),
        subdict(p, "ln2."), cfg.dropout, rng, cfg.pre_ln)
    return x, LayerCache(c_attn, c_ff)


def layer_backward(dy, cache: LayerCache, out=None):
    """Return ``(dx, grads)``."""
    dx, g_ff, g_ln2 = residual.backward(
        dy, cache.ff, lambda d, c: feedforward.backward(d, c, out_part(out, "ff.")),
        out_part(out, "ln2."))
    dx, g_attn, g_ln1 = residual.backward(
        dx, cache.self_attn, lambda d, c: attention.self_backward(d, c, out_part(out, "attn.")),
        out_part(out, "ln1."))
    grads = {**prefixed(g_attn, "attn."), **prefixed(g_ln1, "ln1."),
             **prefixed(g_ff, "ff."), **prefixed(g_ln2, "ln2.")}
    return dx, grads


def stack_forward(x, p, mask, cfg, rng):
    """Run ``cfg.n_layers`` layers; ``p`` holds the stack's parameters (names as above)."""
    layers = []
    for i in range(cfg.n_layers):
        x, c = layer_forward(x, subdict(p, f"{i}."), mask, cfg, rng)
        layers.append(c)
    c_ln = None
    if cfg.pre_ln:
        x, c_ln = layernorm.forward(x, subdict(p, "ln."))
    return x, StackCache(layers, c_ln)


def stack_backward(dy, cache: StackCache, out=None):
    """Return ``(dx, grads)``."""
    grads = {}
    if cache.ln is not None:
        dy, g = layernorm.backward(dy, cache.ln, out_part(out, "ln."))
        grads.update(prefixed(g, "ln."))
    for i in reversed(range(len(cache.layers))):
        dy, g = layer_backward(dy, cache.layers[i], out_part(out, f"{i}."))
        grads.update(prefixed(g, f"{i}."))
    return dy, grads
